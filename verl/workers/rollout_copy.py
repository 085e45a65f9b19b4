"""A rollout-only copy of the policy, for asynchronous (one-step-off) training.

In synchronous training the hybrid :class:`~verl.workers.actor_rollout_ref.ActorRolloutRefWorker`
samples from the module it trains. With ``trainer.async_rollout=true`` the next batch is
generated *while* the current one trains, so the rollout needs weights the optimizer does
not touch: this worker holds its own copy of the policy (built like the actor's: same model,
LoRA, precision, rollout backend) and samples from it. The trainer pushes the actor's
weights into it at step boundaries only, between two generations
(:meth:`RolloutCopyWorker.load_policy_weights`), through the same bucketed, time-limited
push the vLLM backend takes its weights with (:func:`verl.rollout.weight_sync.push_weights`).
With ``rollout.name=vllm`` the copy's engine is a vLLM engine of its own (started like the
hybrid worker's), and each load pushes the new weights on into it at once (its bucketed
``update_weights``), so the next generation samples with them; the seconds reported are the
whole load. Its ``generate`` drives vLLM one engine step at a time under the process-wide
vLLM lock (the actor's engine in this process takes pushes between two steps) and hands each
prompt's group over as vLLM finishes its request when a streaming sink is installed
(:func:`verl.rollout.vllm_stream.copy_generate`). A native engine may keep the rows of a
batch it started for the next call in flight between two calls (continuous batching across
calls, ``verl/rollout/continuous.py``); a weight load drops them, so no row ever mixes the
weights of two loads.

Groups out of a copy in another process (the Ray backend): a ``generate_sequences`` call
whose ``meta_info`` carries :data:`STREAM_TOKEN` (any string naming the call) installs a
sink of its own that keeps each finished group (CPU copies) under a lock, and
:meth:`RolloutCopyWorker.take_streamed_groups` (``register(..., beside=True)``: answered on
a second thread of the actor while the call runs) hands over those of that call. The call's
whole output still holds every group; the driver keeps each once.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from verl.controller import Dispatch, register
from verl.controller.dispatch import get_method_dispatch
from verl.protocol import DataProto
from verl.rollout.weight_sync import push_weights
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.specs import ActorRolloutRefSpec

__all__ = ["STREAM_TOKEN", "RolloutCopyWorker"]

#: ``meta_info`` key of a ``generate_sequences`` call whose groups the driver takes with
#: :meth:`RolloutCopyWorker.take_streamed_groups` while it runs (module docstring)
STREAM_TOKEN = "stream_token"

_GENERATE = get_method_dispatch(ActorRolloutRefWorker.generate_sequences)
assert _GENERATE is not None and _GENERATE.reads is not None


class RolloutCopyWorker(ActorRolloutRefWorker):
    """The policy's rollout on a module of its own; generation and weight loading only.

    Args:
        spec: the copy's spec (:func:`verl.workers.specs.rollout_copy_spec`: the actor's,
            without a reference, on the single engine: one process holds the whole copy, a
            plain module, never sharded; the actor may be FSDP2 over several ranks, its full
            state dict is what this copy loads).
        module: an already-built causal LM (a copy of the actor's initial module) to use
            instead of loading ``actor_rollout_ref.model.path``.
        tokenizer: a tokenizer to use instead of loading one.
    """

    def __init__(
        self,
        spec: ActorRolloutRefSpec,
        module: torch.nn.Module | None = None,
        tokenizer: Any = None,
        **worker_kwargs: Any,
    ) -> None:
        if isinstance(spec, ActorRolloutRefSpec) and (
            spec.actor.strategy != "single" or spec.ref is not None
        ):
            raise ValueError(
                f"the rollout copy runs on the single engine without a reference, got "
                f"strategy={spec.actor.strategy}, role={spec.role}; build its spec with "
                "verl.workers.specs.rollout_copy_spec(config)"
            )
        super().__init__(spec, module=module, tokenizer=tokenizer, **worker_kwargs)
        self.policy_version: int | None = None  # the actor update the weights come from
        # (call token, prompt index, group on CPU, log-prob temperature) of the groups the
        # running call finished and the driver has not taken
        self._streamed: list[tuple[str, int, DataProto, float]] = []
        self._streamed_lock = threading.Lock()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        """The worker's set-up; a vLLM rollout's ``generate`` then runs step by step and
        streams groups inside :func:`verl.rollout.continuous.stream_groups` (module
        docstring)."""
        super().init_model(total_steps)
        if getattr(self.rollout, "engine_name", None) == "vllm":
            from verl.rollout.vllm_stream import copy_generate

            self.rollout.generate = copy_generate(self.rollout)

    @register(
        dispatch_mode=_GENERATE.mode,
        reads=_GENERATE.reads,
        optional=_GENERATE.optional,
        meta=(*_GENERATE.meta, STREAM_TOKEN),
    )
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """The hybrid worker's ``generate_sequences``; with ``meta_info[STREAM_TOKEN]`` each
        prompt's group is also kept for :meth:`take_streamed_groups` as the engine finishes
        it (the samples do not change)."""
        token = prompts.meta_info.pop(STREAM_TOKEN, None)
        if token is None:
            return super().generate_sequences(prompts)
        from verl.rollout.continuous import stream_groups

        def keep(prompt: int, group: DataProto, params: Any) -> None:
            # a copy of its own: a slice would carry its whole batch's storage across
            group = group.clone().to("cpu")
            with self._streamed_lock:
                self._streamed.append((token, prompt, group, params.logprob_temperature))

        with self._streamed_lock:
            self._streamed.clear()  # an earlier call's groups: its whole output has them
        with stream_groups(keep):
            return super().generate_sequences(prompts)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, rank_zero_result=True, beside=True)
    def take_streamed_groups(self, token: str) -> list[tuple[int, DataProto, float]]:
        """The groups the call of ``token`` has finished since the last take, as ``[(prompt
        index, its n rows, log-prob temperature), ...]``; another call's are dropped.
        Answered beside a running call on the Ray backend."""
        with self._streamed_lock:
            taken, self._streamed = self._streamed, []
        return [(prompt, group, temp) for t, prompt, group, temp in taken if t == token]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_policy_weights(self, state: dict[str, torch.Tensor], version: int) -> dict[str, float]:
        """Copy the actor's full state dict ``state`` (names of the actor's module) into
        this copy's module, in place; ``version`` is the number of actor updates it holds.

        Must not run while this worker generates (the trainer calls it between two
        generations, on the rollout's own thread). Returns the push's seconds and size.
        """
        drop = getattr(self.rollout, "drop_session", None)
        if drop is not None:  # rows a native loop kept for a later call: old weights
            drop()
        module = self.engine.module
        targets = module.state_dict()
        missing = sorted(set(targets) - set(state))
        unknown = sorted(set(state) - set(targets))
        if missing or unknown:
            raise ValueError(
                f"load_policy_weights: the actor's state dict does not match the rollout "
                f"copy's module (missing {missing[:3]}, unexpected {unknown[:3]})"
            )

        def receive(weights: Any) -> None:
            for name, tensor in weights:
                targets[name].copy_(tensor)

        rollout = self.spec.rollout
        stats = push_weights(
            receive,
            state.items(),
            bucket_bytes=rollout.weight_sync_bucket_mb * 2**20,
            timeout_s=rollout.weight_sync_timeout_s,
            role="async rollout copy",
            engine="rollout-copy",
            timeout_key="actor_rollout_ref.rollout.vllm.weight_sync_timeout_s",
        )
        seconds = stats["seconds"]
        if self.rollout.owns_weights:  # vLLM: its engine takes them now, between generations
            self.rollout.wake_up()
            seconds += self._sync_rollout_weights()["rollout/weight_sync_seconds"]
            self.rollout.sleep()
        self.policy_version = version
        return {"async/weight_sync_seconds": seconds}
