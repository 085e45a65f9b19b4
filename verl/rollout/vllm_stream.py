"""Groups out of vLLM as they finish: the ``vllm`` rollout inside
:func:`verl.rollout.continuous.stream_groups`.

``VLLMRollout.generate`` hands a whole call to ``LLM.generate``, which returns when its
slowest request ends. :func:`generate_streaming` drives the same engine request by request
instead, through vLLM's offline API: ``LLM.enqueue`` adds the call's requests exactly as
``LLM.generate`` does (one request per prompt, its ``n`` samples fanned out by vLLM), then
``LLM.llm_engine.step()`` runs one scheduler step at a time, vLLM's continuous batching
deciding what decodes, until no request of the call is unfinished. A request's output is
reported once, when its last sample ends (``RequestOutputKind.FINAL_ONLY``, vLLM's
aggregation of the ``n`` children): that prompt's group is assembled at once
(:meth:`~verl.rollout.serving.ServingRollout.build_output` of the one prompt: the layout of
``verl.rollout.base``, responses padded to ``max_new_tokens`` as in the whole call's output)
and handed to the sink, while the other requests keep decoding.

The samples do not change: the requests, their order and the engine steps are those of
``LLM.generate`` (which is ``enqueue`` plus the same step loop), so the output returned at
the end equals the plain call's for the same engine state; only when the groups are seen
differs.

Each engine step runs under the process-wide vLLM lock (``rollout.engine_lock``,
:func:`verl.rollout.serving.engine_lock`): in-process vLLM engines share module-level state,
so a push into another engine of this process (the actor's, after each update) waits for the
step in progress and the generation resumes after it, instead of failing mid-step or holding
the push off for a whole call. The sink runs outside the lock.

Inside :func:`verl.rollout.partial.weight_mailbox` (partial rollouts) the loop takes newer
posted weights into the engine between two steps and tags every token with the version
that sampled it (``rollout_token_versions``, :mod:`verl.rollout.vllm_partial`); the
requests then report cumulative outputs every step, which changes no sample.

:func:`copy_generate` is what the asynchronous rollout copy installs as its vLLM rollout's
``generate`` (:class:`~verl.workers.rollout_copy.RolloutCopyWorker`): always this loop (the
lock per step), with the groups handed to the sink inside ``stream_groups``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from verl.rollout.base import SamplingParams, validate_prompts
from verl.rollout.continuous import GroupSink, current_group_sink
from verl.rollout.partial import current_weight_mailbox, tag_token_versions
from verl.rollout.serving import Sample, token_prompts
from verl.rollout.vllm_partial import MidCallWeights
from verl.rollout.vllm_rollout import group_samples

logger = logging.getLogger(__name__)

__all__ = ["copy_generate", "generate_streaming"]


def generate_streaming(
    rollout: Any, prompts: Any, params: SamplingParams, sink: GroupSink | None
) -> Any:
    """``rollout.generate(prompts, params)`` (a :class:`~verl.rollout.vllm_rollout.VLLMRollout`)
    driven one engine step at a time under ``rollout.engine_lock``, with each prompt's group
    handed to ``sink(prompt index, its n rows, params)`` (unless None) as soon as vLLM
    finishes its request (module docstring); returns the whole call's output.

    Raises:
        RuntimeError: the engine has unfinished requests of another caller (their outputs
            would be mixed into this call's), or vLLM returned an unexpected sample count.
        Whatever ``sink`` raises: the call's remaining requests are aborted first, so the
        engine is left idle.
    """
    rollout._check_usable()
    rollout.wake_up()
    input_ids, attention_mask, position_ids = validate_prompts(prompts)
    llm, lock = rollout.llm, rollout.engine_lock
    engine = llm.llm_engine
    requests = [{"prompt_token_ids": ids} for ids in token_prompts(input_ids, attention_mask)]
    sampling = rollout._sampling_params(params, rollout.stop_ids(params))
    mailbox = current_weight_mailbox()
    partial = None
    if mailbox is not None:  # new weights between two steps (verl.rollout.vllm_partial)
        lengths = [len(r["prompt_token_ids"]) for r in requests]
        partial = MidCallWeights(rollout, mailbox, params.n, params.max_new_tokens, lengths)
    start = time.perf_counter()
    with lock:
        if engine.has_unfinished_requests():
            raise RuntimeError(
                "the vLLM engine has unfinished requests of another call; a streaming "
                "generation drives the engine alone"
            )
        if partial is None:
            internal = llm.enqueue(requests, sampling, use_tqdm=False)
        else:  # cumulative outputs: each step's new tokens get the version in force
            internal = partial.enqueue(llm, requests, sampling)
    # vLLM reports a request under the id it was given (``RequestOutput.request_id``), which
    # also names its n samples' child requests; the ids enqueue returns carry a random
    # suffix of the engine's (``<id>-<8 chars>``)
    external = [rid.rsplit("-", 1)[0] for rid in internal]
    index = {rid: i for i, rid in enumerate(external)}
    samples: list[list[Sample] | None] = [None] * len(requests)
    done = 0
    try:
        while done < len(requests):
            if partial is not None:
                partial.poll()  # the lock is taken by the push itself
            with lock:  # one step: a push into another engine of the process waits for it
                if not engine.has_unfinished_requests():
                    raise RuntimeError(
                        f"the vLLM engine stopped with {len(requests) - done} of this call's "
                        f"{len(requests)} requests unreported"
                    )
                outputs = engine.step()
            if partial is None:
                ended = [(index[o.request_id], o) for o in outputs if o.finished]
            else:
                ended = [(p, partial.request_output(p)) for p in partial.collect(outputs, index)]
            for prompt, out in ended:
                samples[prompt] = group_samples(out, params.n)
                done += 1
                if sink is None:
                    continue
                group = rollout.build_output(
                    prompts[prompt : prompt + 1],
                    params,
                    samples[prompt],
                    position_ids=position_ids[prompt : prompt + 1],
                    seconds=time.perf_counter() - start,
                )
                sink(prompt, _tagged(group, partial, range(prompt, prompt + 1), samples), params)
    except BaseException:
        left = [rid for rid, got in zip(external, samples) if got is None]
        if left:  # by the given ids: a request and its n samples
            with lock:
                engine.abort_request(left, internal=False)
        raise
    finally:
        if partial is not None:
            partial.close()
    seconds = time.perf_counter() - start
    flat = [s for group in samples for s in group]  # prompt order, n per prompt
    out = rollout.build_output(prompts, params, flat, position_ids=position_ids, seconds=seconds)
    return _tagged(out, partial, range(len(requests)), samples)


def _tagged(out: Any, partial: MidCallWeights | None, prompts: range, samples: list[Any]) -> Any:
    """``out`` (the rows of ``prompts``) with ``rollout_token_versions`` under a mailbox."""
    if partial is None:
        return out
    versions = partial.versions(prompts, [samples[p] for p in prompts])
    return tag_token_versions(out, versions, out.batch["response_mask"], partial.mailbox)


def copy_generate(rollout: Any) -> Callable[[Any, SamplingParams], Any]:
    """A ``generate`` for ``rollout`` (a vLLM rollout): :func:`generate_streaming`, with the
    sink :func:`~verl.rollout.continuous.stream_groups` installed (None outside it)."""

    def generate(prompts: Any, params: SamplingParams) -> Any:
        return generate_streaming(rollout, prompts, params, current_group_sink())

    return generate
