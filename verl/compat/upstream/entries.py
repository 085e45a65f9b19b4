"""The entry type of the upstream key table and what its sections share: :class:`UpstreamKey`,
the shared reasons and refusals, and the value readers (a function from the upstream value
to the native one, or :data:`DROP`, or :class:`Refused`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DROP = object()  # UpstreamKey.value's answer for "drop this value with the reason"


@dataclass(frozen=True)
class UpstreamKey:
    """How one upstream key is read.

    ``native``: the key it becomes (``None``: dropped). ``keeps``: the values that are
    dropped or renamed (``None``: any value); another value is refused with ``refusal``.
    ``reason``: why a dropped key changes nothing here. ``value``: maps the upstream value
    to the native one (default: unchanged), or to :data:`DROP` to drop it after all.
    ``reads``: the docs table's account of a key whose reading is more than a rename or a
    drop. ``choice``: the key is a Hydra config-group choice (``engine=fsdp``): only a
    string value is read by this entry, a mapping there is the native section.
    """

    native: str | None = None
    reason: str = ""
    keeps: tuple[Any, ...] | None = None
    refusal: str = ""
    value: Callable[[Any], Any] | None = None
    reads: str = ""
    choice: bool = False


def _drop(reason: str, keeps: tuple[Any, ...] | None = None, refusal: str = "") -> UpstreamKey:
    return UpstreamKey(reason=reason, keeps=keeps, refusal=refusal)


_NO_SP = (
    "sequence parallelism (Ulysses) is not implemented here; set it to 1 (long sequences: "
    "activation checkpointing, actor.logprob_chunk_size, a smaller token budget)"
)
_LOG_PROB_BUDGET = (
    "the log-prob passes micro-batch by the actor's own settings (actor.use_dynamic_bsz, "
    "actor.ppo_max_token_len_per_device, rollout/ref.log_prob_micro_batch_size_per_device); "
    "micro-batching changes memory and speed, never the log-probs"
)
_NOT_HERE = "is not implemented here; leave it null"


_SPEED = "speed and memory only, never results"
_MEGATRON = (
    "Megatron-LM is not available here (it needs CUDA GPUs and Megatron-Core; there is no "
    "Megatron engine in this build): the roles train with FSDP2 (actor.strategy=fsdp2, "
    "critic.strategy=fsdp2; remove the megatron.* keys), or strategy=auto; Megatron's "
    "sequence parallelism has an FSDP2 counterpart: actor_rollout_ref.actor."
    "ulysses_sequence_parallel_size=N (critic.ulysses_sequence_parallel_size)"
)
_PROFILER = (
    "upstream's profilers (nsys, npu, torch memory) record a run and change nothing of its "
    "results; the torch profiler here is trainer.profile_steps (Chrome traces in log_dir)"
)
_VIDEO = "video inputs are not read here (images are: the rows' `images` column)"
_MICRO = (
    "upstream's global micro-batch size (replaced there by *_per_gpu); micro-batching changes "
    "memory and speed, never the loss: the native key is {native}"
)
_ROLLOUT_PARALLEL = (
    "it splits the rollout engine over {what} (memory and speed: the same samples); the "
    "native rollout generates from the actor's own weights in its worker; a vLLM rollout's "
    "own tensor parallelism is rollout.vllm.tensor_parallel_size, an SGLang rollout's "
    "rollout.sglang.tensor_parallel_size"
)


class Refused(Exception):
    """Raised by an :attr:`UpstreamKey.value` function for a value it refuses (the message
    says why and what to use); read as the key's refusal."""


def _strategy(key: str, fsdp: str, why: str) -> UpstreamKey:
    """A native strategy key that also takes upstream's value ``fsdp`` (FSDP1), read as
    ``fsdp``: FSDP1 and FSDP2 shard the same data-parallel training (the same results).
    Upstream's ``megatron`` is refused: there is no Megatron engine here."""

    def read(value: Any) -> Any:
        if value == "megatron":
            raise Refused(_MEGATRON)
        return fsdp if value == "fsdp" else value

    return UpstreamKey(
        native=key,
        value=read,
        reads=f"fsdp: `{fsdp}` ({why}); megatron refused (no Megatron engine: it needs CUDA "
        "GPUs and Megatron-Core); the native values as they are",
    )


_RL_FSDP = "upstream's FSDP1; FSDP2 shards the same training, with the same results"
# The offline engine runs fsdp2 in a process group (torchrun, or Ray ranks) and one process
# unwrapped: auto is fsdp2 on several ranks, single on one, as upstream's FSDP on one rank
# is one process's training.
_OFFLINE_FSDP = (
    "FSDP2 on several ranks (torchrun or trainer.n_gpus_per_node), one unwrapped process on "
    "one: upstream's FSDP1 on one rank trains the same"
)


def _choice_value(allowed: dict[Any, Any], refusal: str) -> Callable[[Any], Any]:
    def read(value: Any) -> Any:
        if value in allowed:
            return allowed[value]
        raise Refused(refusal)

    return read


def _logger_value(value: Any) -> Any:
    """``trainer.logger=console``: one sink written as a string is a list of one."""
    return [value] if isinstance(value, str) else value


def _tool_config(value: Any) -> Any:
    """Upstream's tool YAML: one ``multi_turn.tools`` entry ``{path: the YAML, name: its
    tool_schema's function name}`` per tool. Only the names are read here; what each
    ``class_name`` runs as (or why it is refused) is decided when the tools load, at
    start-up before any model (``verl.tools.upstream_adapter``)."""
    if value is None:
        return DROP
    import yaml

    path = os.path.abspath(os.fspath(value))
    if not os.path.isfile(path):
        raise Refused(f"tool config {path}: no such file")
    try:
        with open(path, encoding="utf-8") as fh:
            tools = (yaml.safe_load(fh) or {}).get("tools")
        names = [entry["tool_schema"]["function"]["name"] for entry in tools]
    except (yaml.YAMLError, AttributeError, KeyError, TypeError) as exc:
        raise Refused(
            f"tool config {path}: not upstream's format, a 'tools:' list of {{class_name, "
            f"config, tool_schema: {{type: function, function: {{name, ...}}}}}} "
            f"({type(exc).__name__}: {exc})"
        ) from None
    if not names or not all(isinstance(n, str) and n for n in names):
        raise Refused(f"tool config {path}: no tools, or a tool_schema without a name")
    return [{"path": path, "name": name} for name in names]


def _reward_manager(value: Any) -> Any:
    """Upstream's reward-manager names: ``dapo`` and ``prime`` score each response with the
    data source's scorer, as ``naive`` does (dapo's overlong penalty is
    reward_model.overlong_buffer.*, prime's parallel workers are a speed-up)."""
    if value in ("dapo", "prime"):
        return "naive"
    if value == "batch":
        raise Refused(
            "the batch reward manager calls compute_score(data_sources, solution_strs, "
            "ground_truths, extra_infos) once per batch; here a custom reward function scores "
            "one response (compute_score(data_source, solution_str, ground_truth, extra_info)): "
            "write it per response and use reward_model.reward_manager=naive"
        )
    return value


def _policy_kwarg(name: str, default: float) -> UpstreamKey:
    """``actor.policy_loss.<name>`` (upstream's loss hyperparameter): its default, which is
    the loss's own default here, is dropped; another value goes to policy_loss_kwargs."""
    native = f"actor_rollout_ref.actor.policy_loss_kwargs.{name}"
    return UpstreamKey(
        native=native,
        reason=f"{default} is the loss's own default here",
        value=lambda value: DROP if value == default else value,
        reads=f"{default} (the loss's own default here): dropped; another value: renamed "
        f"`{native}` (checked against the chosen loss's hyperparameters)",
    )


def _device(value: Any) -> Any:
    if value == "npu":
        raise Refused("Ascend NPUs are not supported; the devices here are cpu and cuda (auto)")
    return value


def _defaults_list(value: Any) -> Any:
    """A Hydra ``defaults:`` list of an upstream config file: the config it builds on is this
    build's defaults; a Megatron group is refused."""
    text = repr(value)
    if "megatron" in text:
        raise Refused(_MEGATRON)
    return DROP
