"""Config sections of response generation: ``actor_rollout_ref.rollout`` (sampling, validation
sampling), multi-turn rollouts with tools, agent programs, and the serving engines' settings.
"""

# `entry(...)` returns a dataclasses.Field (default_factory for mutables), which RUF009 cannot see.
# ruff: noqa: RUF009

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from verl.config._fields import entry


@dataclass
class ValKwargsConfig:
    """Sampling settings used for validation (greedy by default)."""

    n: int = entry(1, "responses per validation prompt", ge=1)
    temperature: float = entry(0.0, "sampling temperature", ge=0)
    top_p: float = entry(1.0, "nucleus sampling mass, in (0, 1]", gt=0, le=1)
    top_k: int = entry(-1, "top-k sampling; -1 = off", ge=1, off=-1)
    do_sample: bool = entry(False, "sample; false = greedy")


@dataclass
class ToolConfig:
    """One tool of multi-turn rollouts: a function (or ``verl.tools.Tool``) in a file or a
    module. In Python, :meth:`from_function` (or a function put in ``MultiTurnConfig.tools``)
    makes one from the function itself, written as its import path ``module:qualname``."""

    path: str = entry(
        "builtin",
        "Python file defining the tool, or an import path module:qualname; "
        "builtin = verl's own tools",
    )
    name: str = entry("calculator", "the tool's name (builtin: calculator, python)")

    @classmethod
    def from_function(cls, fn: Any, name: str | None = None) -> ToolConfig:
        """The entry of a tool function (or ``verl.tools.Tool``) defined at the top level of
        an importable module (``path: module:qualname``) or of a file loaded by verl
        (``path: file.py``). The config is written as YAML into every checkpoint, so a
        function with no such form (a lambda, a nested function, one defined in the script
        being run) raises ``ValueError`` saying so."""
        from verl.utils.import_path import NotImportableError, import_path

        tool_name = name or getattr(fn, "name", None) or getattr(fn, "__name__", None)
        module = sys.modules.get(getattr(fn, "__module__", None) or "")
        source = getattr(module, "__file__", None)
        if (  # loaded from a file by verl (verl.utils.file_import): name the file
            getattr(module, "__name__", "").startswith("_verl_")
            and source
            and getattr(fn, "__qualname__", None) == tool_name
        ):
            return cls(path=source, name=tool_name)
        try:
            return cls(path=import_path(fn), name=tool_name)
        except NotImportableError as exc:
            raise ValueError(
                f"multi_turn.tools: the tool {tool_name!r} cannot be written into the run's "
                f"config (saved as YAML in every checkpoint; a resumed run and each worker "
                f"load the tool from it): {exc}. Or set multi_turn.tools=[{{path: file.py, "
                f"name: {tool_name}}}]"
            ) from exc

    @staticmethod
    def not_a_section_hint(value: Any) -> str:
        """The end of the validation message for a ``tools`` item that is not an entry."""
        if not callable(value):
            return ""
        try:
            fixed = ToolConfig.from_function(value)
        except ValueError as exc:
            return f"; {exc}"
        return (
            f"; write ToolConfig.from_function(fn), i.e. {{path: {fixed.path}, name: {fixed.name}}}"
        )


@dataclass
class InteractionConfig:
    """The environment of multi-turn rollouts: replies as a user turn after a final answer."""

    path: str | None = entry(
        None, "Python file defining the interaction; builtin = verl's own; null = no interaction"
    )
    name: str = entry("arithmetic_retry", "the function's name (builtin: arithmetic_retry)")


@dataclass
class MultiTurnConfig:
    """Multi-turn rollouts with tools (the agent loop, docs/multiturn.md)."""

    enable: bool = entry(False, "generate with the agent loop: model turns and tool results")
    max_turns: int = entry(4, "model turns per response (tool results come between them)", ge=1)
    max_tool_response_tokens: int = entry(256, "tokens of a tool result kept; longer is cut", ge=1)
    tools: list[ToolConfig] = entry([], "tools the model may call: a list of {path, name}")
    tool_timeout: float = entry(10.0, "seconds a round of tool calls may take; then an error", gt=0)
    max_parallel_tool_calls: int = entry(
        8, "tool calls run at once per rollout worker; the others of a round wait", ge=1
    )
    interaction: InteractionConfig = entry(
        InteractionConfig, "replies to a turn without a tool call (feedback, or the end)"
    )

    def __post_init__(self) -> None:
        # A function (or verl.tools.Tool) given in Python becomes its {path, name} entry; one
        # that has no such form stays, and validation refuses it (ToolConfig.not_a_section_hint).
        if isinstance(self.tools, (list, tuple)):
            self.tools = [_tool_entry(t) for t in self.tools]


@dataclass
class AgentProgramConfig:
    """Agent programs as rollouts (docs/agents.md): the user's agent talks to an
    OpenAI-compatible endpoint served from the rollout engine during the rollout."""

    program: str | None = entry(
        None,
        "the agent, fn(base_url, api_key, task) -> reward | None: an import path "
        "module:function or file.py:function; null = no agent program",
    )
    command: str | None = entry(
        None,
        "or a command run per rollout (task JSON on stdin, OPENAI_BASE_URL / OPENAI_API_KEY "
        "in its environment, reward JSON on its last stdout line); null = none",
    )
    concurrency: int = entry(16, "agents running at once on each rollout worker", ge=1)
    timeout_s: float = entry(300.0, "seconds an agent may run; then it is stopped, no row", gt=0)
    max_requests: int = entry(64, "model requests one agent may make; more are refused", ge=1)

    @property
    def enable(self) -> bool:
        """Whether rollouts run an agent program (``program`` or ``command`` set)."""
        return bool(self.program) or bool(self.command)


def _tool_entry(item: Any) -> Any:
    if isinstance(item, ToolConfig) or not callable(item):
        return item
    try:
        return ToolConfig.from_function(item)
    except ValueError:
        return item


@dataclass
class ServingEngineConfig:
    """Settings every serving-engine backend (vllm, sglang) has: lengths and the weight push."""

    max_model_len: int | None = entry(
        None,
        "longest prompt + response in tokens; null = data.max_prompt_length + max_response_length",
    )
    weight_sync_bucket_mb: float = entry(
        256.0, "MiB per bucket of the post-update weight push", gt=0
    )
    weight_sync_timeout_s: float = entry(
        120.0, "seconds the engine may take per bucket before the sync fails with an error", gt=0
    )


@dataclass
class VLLMRolloutConfig(ServingEngineConfig):
    """The vllm rollout backend's engine (read only when rollout.name=vllm)."""

    kv_cache_gib: int = entry(1, "KV-cache size on CPU in whole GiB (VLLM_CPU_KVCACHE_SPACE)", ge=1)
    gpu_memory_utilization: float = entry(
        0.5, "fraction of GPU memory vLLM may use (CUDA)", gt=0, le=1
    )
    enforce_eager: bool = entry(True, "no graph capture (capture costs ~100 s at start on CPU)")
    tensor_parallel_size: int = entry(
        1,
        "vLLM's own tensor-parallel size: worker processes, each with 1/N of every layer "
        "(1: the engine runs in the rollout's process)",
        ge=1,
    )


@dataclass
class SGLangRolloutConfig(ServingEngineConfig):
    """The sglang rollout backend's engine (read only when rollout.name=sglang; CUDA only)."""

    mem_fraction_static: float = entry(
        0.5, "fraction of GPU memory SGLang takes for weights and KV cache", gt=0, le=1
    )
    tensor_parallel_size: int = entry(1, "SGLang's own tensor-parallel size (tp_size)", ge=1)


@dataclass
class RolloutConfig:
    """Response generation. Response length is data.max_response_length."""

    name: str = entry("native", "rollout backend: native, hf, vllm, sglang")
    n: int = entry(4, "responses sampled per prompt (GRPO-style estimators need >= 2)", ge=1)
    temperature: float = entry(1.0, "sampling temperature (> 0 when do_sample)", ge=0)
    top_p: float = entry(1.0, "nucleus sampling mass, in (0, 1]", gt=0, le=1)
    top_k: int = entry(-1, "top-k sampling; -1 = off", ge=1, off=-1)
    do_sample: bool = entry(True, "sample; false = greedy")
    stop: list[str] = entry([], "extra stop strings (EOS always stops)")
    log_prob_micro_batch_size_per_device: int | None = entry(
        None,
        "samples per forward when recomputing old log-probs; null = as the actor's update "
        "(its token budget by default)",
        ge=1,
    )
    seed: int | None = entry(None, "sampling seed; null = trainer.seed")
    compile_decode: bool = entry(
        False, "native: torch.compile the decode step over a static KV cache (docs/rollout.md)"
    )
    decode_slots: int | None = entry(
        None,
        "native: rows (samples) decoded at once, the KV cache's slots; a call with more rows "
        "runs through them (docs/rollout.md#continuous-batching); null = every row at once",
        ge=1,
    )
    continuous_batching: bool = entry(
        True,
        "native, with more rows than decode_slots: refill a finished row's slot with the next "
        "prompt at once; false = lock-step waves, each decoded until its longest row ends",
    )
    val_kwargs: ValKwargsConfig = entry(ValKwargsConfig, "validation sampling")
    multi_turn: MultiTurnConfig = entry(MultiTurnConfig, "multi-turn rollouts with tools")
    agent: AgentProgramConfig = entry(
        AgentProgramConfig, "agent programs as rollouts, over an OpenAI-compatible endpoint"
    )
    vllm: VLLMRolloutConfig = entry(VLLMRolloutConfig, "vllm backend engine settings")
    sglang: SGLangRolloutConfig = entry(SGLangRolloutConfig, "sglang backend engine settings")
