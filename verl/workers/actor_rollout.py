"""The rollout side of the hybrid actor worker: its engine, sampling and weight pushes.

Contract:

- :func:`build_policy_rollout` checks the backend (package, device) and refuses an engine
  that serves several ranks in lock step together with a per-rank agent loop, before any
  model loads; :func:`rank_rollout` builds the rank's engine over the actor's module.
- :func:`sampling_params` is the rollout spec's defaults with a call's ``meta_info``
  overrides; with a fixed ``rollout.seed`` each call and each data-parallel rank gets its
  own reproducible seed.
- :func:`run_generation` samples on the training weights in place (inside
  ``engine.gathered_params()`` and the training precision's autocast), or, for an engine
  that keeps its own copy of the weights (vLLM), wakes it, pushes stale weights first
  (:func:`push_actor_weights`) and puts it back to sleep.
- :func:`push_actor_weights` sends the actor module's state dict (LoRA adapters folded in)
  into such an engine.
- Tensor parallelism (``actor.tensor_parallel_size``): the ranks of a tensor group generate
  together from their weight shards (every forward runs the group's collectives), so they
  must sample the same rows the same way: :func:`generation_group` names the group,
  ``verl.workers.common.join_in_group`` gives each of its ranks the group's prompts,
  :func:`agreed_seed` one seed (the data-parallel rank's), and :func:`own_samples` cuts
  each rank's samples back out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from verl.models.lora import is_lora_model, lora_scaling, merged_state_dict
from verl.protocol import DataProto
from verl.rollout import SamplingParams, get_rollout_engine
from verl.rollout.rank_zero import build_rank_rollout
from verl.utils.memory import release_memory
from verl.workers.common import to_device
from verl.workers.specs import RolloutSpec

__all__ = [
    "SAMPLING_OVERRIDES",
    "agreed_seed",
    "build_policy_rollout",
    "generation_group",
    "own_samples",
    "push_actor_weights",
    "rank_rollout",
    "run_generation",
    "sampling_params",
]

SAMPLING_OVERRIDES = ("n", "temperature", "top_p", "top_k", "do_sample")


def build_policy_rollout(spec: RolloutSpec, world_size: int) -> tuple[type, bool]:
    """The backend class of ``spec.name`` (checked available) and whether its one engine
    serves all ``world_size`` ranks (an engine with its own weights on several ranks).

    Raises:
        NotImplementedError: such a shared engine with ``multi_turn`` or ``agent`` on.
    """
    rollout_cls = get_rollout_engine(spec.name)
    rollout_cls.check_available()  # package / device, before any model loads
    shared_engine = rollout_cls.owns_weights and world_size > 1
    if shared_engine and (spec.multi_turn.enable or spec.agent.enable):
        raise NotImplementedError(
            f"rollout.name={spec.name} on {world_size} ranks serves all ranks "
            "from one engine in lock step, which multi_turn.enable=true cannot use; use "
            "one actor rank or rollout.name=native"
        )
    return rollout_cls, shared_engine


def rank_rollout(
    rollout_cls: type,
    spec: RolloutSpec,
    module: torch.nn.Module,
    tokenizer: Any,
    rank: int,
    world_size: int,
) -> Any:
    """This rank's rollout engine over ``module`` (``verl.rollout.rank_zero``).

    An engine with weights of its own on one rank pushes the module's weights as it starts;
    a LoRA module's state dict has peft's names and unfolded adapters, which such an engine
    cannot load, so that first push is the folded weights (as every later push is)."""
    options = dict(spec.options)
    fold_lora = rollout_cls.owns_weights and world_size == 1 and is_lora_model(module)
    if fold_lora:
        options["push_initial_weights"] = False
    rollout = build_rank_rollout(
        rollout_cls, module, tokenizer, options, rank=rank, world_size=world_size
    )
    if fold_lora:
        rollout.update_weights(merged_state_dict(module.state_dict(), lora_scaling(module)).items())
    return rollout


def sampling_params(
    spec: RolloutSpec,
    meta_info: dict[str, Any],
    *,
    eos_token_id: int | None,
    max_new_tokens: int,
    generate_calls: int,
    rank: int,
) -> SamplingParams:
    """The sampling of one ``generate_sequences`` call: ``spec``'s defaults, overridden by
    the sampling keys of ``meta_info``; ``meta_info["seed"]``, else with ``spec.seed`` set a
    seed of the call count and the rank."""
    values = {key: getattr(spec, key) for key in SAMPLING_OVERRIDES}
    values |= {k: meta_info[k] for k in SAMPLING_OVERRIDES if k in meta_info}
    seed = meta_info.get("seed")
    if seed is None and spec.seed is not None:
        # A fixed rollout.seed seeds each call (and each data-parallel rank)
        # differently, reproducibly.
        seed = spec.seed + generate_calls + 100_003 * rank
    return SamplingParams(
        n=values["n"],
        temperature=values["temperature"],
        top_p=values["top_p"],
        top_k=values["top_k"],
        do_sample=values["do_sample"],
        max_new_tokens=max_new_tokens,
        stop_token_ids=[eos_token_id] if eos_token_id is not None else [],
        stop_strings=list(spec.stop),
        seed=seed,
    )


def push_actor_weights(engine: Any, rollout: Any) -> dict[str, float]:
    """Push the actor's weights into a rollout engine that keeps its own copy (vLLM).

    The module's own state dict: HF names, ``lm_head.weight`` included when tied; FSDP2
    DTensors are gathered bucket by bucket by the push (on several ranks every rank joins
    the gather and rank 0 pushes: ``verl.rollout.rank_zero``).
    """
    module = engine.module
    state = module.state_dict()
    if is_lora_model(module):  # the engine takes plain weights: adapters folded in
        state = merged_state_dict(state, lora_scaling(module))
    stats = rollout.update_weights(state.items())
    return {"rollout/weight_sync_seconds": stats["seconds"]}


def run_generation(
    engine: Any,
    rollout: Any,
    run: Callable[[DataProto, SamplingParams], DataProto],
    prompts: DataProto,
    params: SamplingParams,
    device: torch.device,
    push_stale: Callable[[], Any] | None,
) -> DataProto:
    """``run(prompts, params)`` (the rollout's ``generate`` or the agent loop's) on the
    host's ``prompts``; the output on the host, with the log-prob ``temperature``.

    ``push_stale``: for an engine with its own weights, what pushes them when they are
    stale (``None``: they are current).
    """
    if rollout.owns_weights:
        # Its own copy of the weights: no gather; an update or a checkpoint load marks
        # them stale and they are pushed here, before the generation that uses them.
        rollout.wake_up()
        if push_stale is not None:
            push_stale()
        out = run(to_device(prompts, device), params).to("cpu")
        rollout.sleep()
    else:
        # Sampling computes in the training precision (mixed_precision=bf16 -> bf16
        # autocast), as the log-prob passes that score these samples do.
        with engine.gathered_params(), engine.autocast():
            out = run(to_device(prompts, device), params).to("cpu")
    # The trainer's log-prob recomputation must use the temperature that sampled.
    out.meta_info["temperature"] = params.logprob_temperature
    release_memory()  # the KV cache and decode buffers, before the next phase
    return out


def generation_group(engine: Any, rollout: Any) -> Any:
    """The tensor group (``engine.tensor_parallel``) whose ranks generate together from the
    actor's shards, or ``None``: no tensor parallelism, or an engine with its own weights
    (each rank samples its own prompts there)."""
    tp = getattr(engine, "tensor_parallel", None)
    if tp is None or tp.size == 1 or rollout.owns_weights:
        return None
    return tp


def agreed_seed(params: SamplingParams, group: Any) -> SamplingParams:
    """``params`` with the seed of the group's first rank when it has none (a rollout would
    draw one from each rank's own global RNG). Collective over the group."""
    if params.seed is not None:
        return params
    from verl.kernels.ulysses import gather_in_group

    seed = int(torch.randint(0, 2**62, (1,)).item())  # as the native rollout draws it
    return dataclasses.replace(params, seed=int(gather_in_group(seed, group)[0]))


def own_samples(out: DataProto, prompts: slice, n: int) -> DataProto:
    """The samples of the prompts ``prompts`` (rows ``n * start`` to ``n * stop``: a
    rollout output holds each prompt's ``n`` samples together), copied out."""
    return out[torch.arange(prompts.start * n, prompts.stop * n)]
