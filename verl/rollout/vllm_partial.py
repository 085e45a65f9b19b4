"""Partial rollouts on the ``vllm`` backend: new weights between two engine steps of a call.

The rollout copy drives its vLLM engine one scheduler step at a time
(:func:`verl.rollout.vllm_stream.generate_streaming`), and in-process vLLM (sync scheduling)
has nothing in flight between two ``LLMEngine.step()`` calls: the step's forward, sampling
and output processing are done when it returns. Inside
:func:`verl.rollout.partial.weight_mailbox`, :class:`MidCallWeights` polls the mailbox
before every step and, when newer weights were posted, loads them into the copy's module
(:meth:`~verl.rollout.partial.WeightMailbox.poll`) and pushes them into the engine through
the same bucketed push as between calls (:meth:`~verl.rollout.serving.ServingRollout.
update_weights`, under the process-wide engine lock). The requests in flight then:

- ``continue``: keep their KV cache (keys / values the old weights wrote) and decode on under
  the new weights. vLLM drops its prefix cache only when no request holds KV blocks, so the
  reset that every push makes is deferred to the end of the call
  (``VLLMRollout.prefix_cache_stale``): a prompt first scheduled after the swap may reuse
  cached prompt blocks of the old weights (as the running requests use their own).
- ``resume``: are preempted right after the push (``reset_prefix_cache(
  reset_running_requests=True)``, vLLM's own path for weight updates in RL): their KV
  blocks are freed, the prefix cache is cleared, and vLLM prefills prompt + the tokens
  generated so far again under the new weights before sampling the next one, keeping the
  tokens (and log-probs) already sampled. Every later token is drawn from exactly
  ``pi_new(. | prefix)``.

Per-token versions: the requests report cumulative outputs every step
(``RequestOutputKind.CUMULATIVE``; which tokens vLLM samples does not depend on it), so the
tokens a sample gained in a step (its length now minus its length after the previous step)
are tagged with the version in force during that step: ``rollout_token_versions`` (rows, R)
int64, -1 past each response, the native engine's layout. Log-probs stay vLLM's processed
log-probs of the sampled token: the probability it was drawn with.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import torch

from verl.rollout.partial import WeightMailbox
from verl.rollout.serving import Sample

__all__ = ["MidCallWeights"]


class MidCallWeights:
    """One streaming call's side of a partial rollout on vLLM (module docstring).

    Args:
        rollout: the :class:`~verl.rollout.vllm_rollout.VLLMRollout` (its ``llm``,
            ``module``, ``engine_lock``, ``update_weights``).
        mailbox: the :class:`~verl.rollout.partial.WeightMailbox` in force (``held`` set).
        n: samples per prompt; ``max_new``: the call's ``max_new_tokens``.
        prompt_lengths: each request's prompt length (the tokens a resume prefills again).
    """

    def __init__(
        self,
        rollout: Any,
        mailbox: WeightMailbox,
        n: int,
        max_new: int,
        prompt_lengths: list[int],
    ) -> None:
        self.rollout, self.mailbox = rollout, mailbox
        self.n, self.max_new = n, max_new
        self.prompt_lengths = prompt_lengths
        self.version = int(mailbox.held)
        self.swaps = 0
        # per (prompt, sample): its latest cumulative CompletionOutput and the version of
        # each token it holds
        self._latest: dict[tuple[int, int], Any] = {}
        self._tags: dict[tuple[int, int], list[int]] = {}
        self._ended: dict[int, set[int]] = {}
        self._reported: set[int] = set()

    def enqueue(self, llm: Any, requests: list[dict[str, Any]], sampling: Any) -> list[str]:
        """``LLM.enqueue(requests, sampling)`` with cumulative outputs every step: the same
        requests through ``LLMEngine.add_request`` (``LLM`` forces final-only outputs);
        returns the engine's request ids. A failure aborts the requests already added."""
        sampling.output_kind = type(sampling.output_kind).CUMULATIVE  # vLLM's RequestOutputKind
        engine, added = llm.llm_engine, []
        try:
            for request in requests:
                rid = str(next(llm.request_counter))
                added.append(engine.add_request(rid, request, sampling))
        except BaseException:
            if added:
                engine.abort_request(added, internal=True)
            raise
        return added

    # ------------------------------------------------------------------ between two steps
    def poll(self) -> int | None:
        """Before an engine step: take newer posted weights into the module and the engine
        (and, in ``resume`` mode, preempt the running requests); returns the new version,
        None when nothing was posted."""
        version = self.mailbox.poll(self.rollout.module)
        if version is None:
            return None
        start = time.perf_counter()
        self.rollout.update_weights(self.rollout.module.state_dict().items())
        if self.mailbox.mode == "resume":
            self._preempt_running()
        self.mailbox.stats["load_s"] += time.perf_counter() - start
        self.version = version
        self.swaps += 1
        return version

    def _preempt_running(self) -> None:
        """Drop every running request's KV cache and the prefix cache: vLLM recomputes
        prompt + generated tokens under the new weights when it schedules them again."""
        rollout = self.rollout
        with rollout.engine_lock:
            if not rollout.llm.reset_prefix_cache(reset_running_requests=True):
                raise RuntimeError(
                    "trainer.partial_rollout=resume: vLLM could not reset its prefix cache "
                    "after a mid-call weight push, so requests would reuse keys / values of "
                    "the old weights; use trainer.partial_rollout=continue"
                )
            rollout.prefix_cache_stale = False
        started = [
            key
            for key, tags in self._tags.items()
            if tags and key[1] not in self._ended.get(key[0], ())
        ]
        self.mailbox.stats["resumed_rows"] += float(len(started))
        self.mailbox.stats["reprefill_tokens"] += float(
            sum(self.prompt_lengths[p] + len(self._tags[(p, j)]) for p, j in started)
        )

    # ------------------------------------------------------------------ after a step
    def collect(self, outputs: list[Any], index: dict[str, int]) -> list[int]:
        """Record one step's cumulative ``outputs`` (vLLM ``RequestOutput``, one per sample
        that advanced; ``index``: request id -> prompt); the prompts whose ``n`` samples
        have all ended with this step."""
        complete = []
        for out in outputs:
            prompt = index[out.request_id]
            for c in out.outputs:
                key = (prompt, c.index)
                tags = self._tags.setdefault(key, [])
                tags.extend([self.version] * (len(c.token_ids) - len(tags)))
                self._latest[key] = c
                if c.finish_reason is not None:
                    self._ended.setdefault(prompt, set()).add(c.index)
            if len(self._ended.get(prompt, ())) == self.n and prompt not in self._reported:
                self._reported.add(prompt)
                complete.append(prompt)
        return complete

    def request_output(self, prompt: int) -> Any:
        """A finished prompt's samples as ``group_samples`` reads a ``RequestOutput``."""
        return SimpleNamespace(outputs=[self._latest[(prompt, j)] for j in range(self.n)])

    def versions(self, prompts: range, samples: list[list[Sample]]) -> torch.Tensor:
        """``rollout_token_versions`` of ``prompts`` ((len(prompts) * n, max_new) int64, -1
        past each response); ``samples``: their samples, n per prompt."""
        rows = torch.full((len(prompts) * self.n, self.max_new), -1, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            for j, (ids, _) in enumerate(samples[i]):
                tags = self._tags[(prompt, j)][: min(len(ids), self.max_new)]
                rows[i * self.n + j, : len(tags)] = torch.tensor(tags, dtype=torch.long)
        return rows

    def close(self) -> None:
        """After the call (its requests ended or aborted): the prefix-cache reset the
        mid-call pushes deferred (``continue``), so no later call reuses old keys / values."""
        rollout = self.rollout
        if getattr(rollout, "_broken", None) is not None:  # a failed push: refused from now on
            return
        with rollout.engine_lock:
            if getattr(rollout, "prefix_cache_stale", False):
                rollout._after_load()
