"""The config checks of the offline trainers (``SFTConfig``, ``DPOConfig``, ``RMConfig``):
the data, the model, the optimizer, the DPO loss and the ranks, each problem naming the keys,
the value and the fix. :data:`OFFLINE_CONFIG_CHECKS` is registered in
``verl.registry.CONFIG_CHECKS`` under each class's name, so ``load_sft_config`` and
``cfg.validate()`` (``verl.config.validate``) run them without the config importing the
trainer.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from verl.config.load import ConfigProblem
from verl.config.schema import ClusterRunConfig
from verl.config.schema_offline import DPOConfig, PreferenceDataConfig, RMConfig, SFTConfig
from verl.config.validate import ConfigChecks
from verl.trainer.config_checks import (
    Checks,
    check_data_source,
    check_optim,
    check_registries,
    check_run,
)
from verl.utils.yaml_text import show

__all__ = ["OFFLINE_CONFIG_CHECKS", "offline_problems", "ranks_named"]


def ranks_named(trainer: ClusterRunConfig) -> str:
    """The keys that set the number of ranks, with their values, for messages."""
    per_node = f"trainer.n_gpus_per_node={trainer.n_gpus_per_node}"
    if trainer.nnodes == 1:
        return per_node
    return f"trainer.nnodes={trainer.nnodes} x {per_node} = {trainer.world_size}"


def offline_problems(
    cfg: SFTConfig | DPOConfig | RMConfig,
    *,
    registries: Mapping[str, Iterable[str]] | None = None,
    skip_paths: Collection[str] = (),
) -> tuple[list[ConfigProblem], list[str]]:
    """Every semantic check of a well-typed offline config: ``(problems, warnings)``."""
    c = Checks(skip_paths)
    builtin = not cfg.data.train_files and cfg.data.builtin == "arithmetic"
    c.fields(cfg, inactive=() if builtin else ("data.arithmetic",))
    _check_data(c, cfg, builtin)
    c.model("model", cfg.model)
    check_optim(c, "optim", cfg.optim)
    if isinstance(cfg, DPOConfig):
        _check_algorithm(c, cfg)
    check_run(c, cfg.trainer)
    _check_ranks(c, cfg)
    check_registries(c, cfg, registries)
    return c.problems, c.warnings


def _check_data(c: Checks, cfg: SFTConfig | DPOConfig | RMConfig, builtin: bool) -> None:
    d = cfg.data
    if d.micro_batch_size_per_device > d.train_batch_size >= 1:
        c.warn(
            f"data.micro_batch_size_per_device={d.micro_batch_size_per_device} is larger than "
            f"data.train_batch_size={d.train_batch_size}; micro-batches hold at most one batch"
        )
    check_data_source(c, d, builtin)
    rl_only = {
        "balance_digits": "balances digit counts",
        "negative": "has negative answers",
    }
    for key, what in rl_only.items():
        if builtin and getattr(d.arithmetic, key):
            c.error(
                f"data.arithmetic.{key}",
                f"data.arithmetic.{key}=true: only the RL built-in data (verl train) {what}; "
                "the SFT/DPO built-in sets do not, so remove it",
            )
    if builtin and list(d.arithmetic.phrasings) != ["question"]:
        c.error(
            "data.arithmetic.phrasings",
            f"data.arithmetic.phrasings={list(d.arithmetic.phrasings)}: only the RL built-in "
            "data (verl train) varies the question's phrasing; remove it",
        )
    if isinstance(d, PreferenceDataConfig) and d.max_prompt_length >= d.max_length >= 2:
        c.error(
            ("data.max_prompt_length", "data.max_length"),
            f"data.max_prompt_length={d.max_prompt_length}: leaves no room for the "
            f"completion within data.max_length={d.max_length}; make it smaller",
        )


def _check_algorithm(c: Checks, cfg: DPOConfig) -> None:
    a, p = cfg.algorithm, "algorithm"
    if 0 < a.label_smoothing < 0.5 and a.loss_type not in ("dpo", "sigmoid"):
        c.error(
            (f"{p}.label_smoothing", f"{p}.loss_type"),
            f"{p}.label_smoothing={show(a.label_smoothing)}: only the dpo loss uses it, but "
            f"{p}.loss_type={a.loss_type}; set it to 0",
        )


def _check_ranks(c: Checks, cfg: SFTConfig | DPOConfig | RMConfig) -> None:
    t, d = cfg.trainer, cfg.data
    ranks = t.world_size
    if ranks <= 1:
        return
    keys = (
        ("trainer.nnodes", "trainer.n_gpus_per_node")
        if t.nnodes > 1
        else ("trainer.n_gpus_per_node",)
    )
    if cfg.engine.strategy == "single":
        c.error(
            (*keys, "engine.strategy"),
            f"{ranks_named(t)}: the single engine trains in one process; set "
            "engine.strategy=fsdp2 (or auto)",
        )
    c.package(keys[0], str(getattr(t, keys[0].split(".")[1])), "ray", "pip install 'verl[ray]'")
    micro_batches = -(-d.train_batch_size // max(d.micro_batch_size_per_device, 1))
    if d.train_batch_size >= 1 and micro_batches % ranks:
        c.error(
            ("data.train_batch_size", "data.micro_batch_size_per_device"),
            f"data.train_batch_size={d.train_batch_size} in micro-batches of "
            f"data.micro_batch_size_per_device={d.micro_batch_size_per_device} gives "
            f"{micro_batches} micro-batches per step, which {ranks_named(t)} "
            f"ranks cannot share equally; make it a multiple of {ranks}",
        )


OFFLINE_CONFIG_CHECKS = ConfigChecks(problems=offline_problems)
