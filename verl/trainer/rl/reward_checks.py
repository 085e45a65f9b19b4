"""The config checks of an RL run's rewards: the reward model's bounds and path, the reward
sources it mixes (a judge, a remote service, rules, a model), the overlong buffer and the
user's scoring function. Part of ``verl.trainer.rl.config_checks``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from verl.trainer.config_checks import Checks
from verl.utils.yaml_text import show

if TYPE_CHECKING:
    from verl.config.schema import TrainerConfig

__all__ = ["check_reward_sources", "check_rewards"]


MIXTURE_SOURCES = ("rules", "model", "judge", "remote")


def check_reward_sources(c: Any, rm: Any, p: str = "reward_model") -> None:
    """Report (``c.error(keys, message)``, a :class:`~verl.trainer.config_checks.Checks`) the reward
    source settings of ``rm`` (a ``RewardModelConfig``) that cannot work."""
    judge = rm.judge
    if judge.enable and judge.backend == "local" and not judge.model_path:
        c.error(
            (f"{p}.judge.model_path", f"{p}.judge.backend"),
            f"{p}.judge.backend=local needs {p}.judge.model_path (a HF causal LM directory)",
        )
    if judge.enable and judge.backend == "http":
        for key in ("base_url", "model"):
            if not getattr(judge, key):
                c.error(
                    (f"{p}.judge.{key}", f"{p}.judge.backend"),
                    f"{p}.judge.backend=http needs {p}.judge.{key}",
                )
    if rm.remote.url is not None and not rm.remote.url.startswith(("http://", "https://")):
        c.error(f"{p}.remote.url", f"{p}.remote.url={rm.remote.url!r}: must be an http(s):// URL")
    on = {
        "model": rm.enable,
        "judge": judge.enable,
        "remote": rm.remote.url is not None,
        "rules": True,
    }
    for name, weight in rm.mixture.items():
        if name not in MIXTURE_SOURCES:
            c.error(
                f"{p}.mixture",
                f"{p}.mixture names {name!r}: the sources are {', '.join(MIXTURE_SOURCES)}",
            )
        elif not on[name]:
            need = {"model": "reward_model.enable=true", "judge": "reward_model.judge.enable=true"}
            c.error(
                f"{p}.mixture",
                f"{p}.mixture weighs {name!r}, which is not configured: set "
                f"{need.get(name, 'reward_model.remote.url')}",
            )
        if not isinstance(weight, int | float) or weight != weight or abs(weight) == float("inf"):
            c.error(f"{p}.mixture", f"{p}.mixture.{name}={weight!r}: must be a finite number")
    extra = [name for name in ("model", "judge", "remote") if on[name]]
    if not rm.mixture and len(extra) > 1:
        c.error(
            f"{p}.mixture",
            f"{' and '.join(extra)} are all configured as reward sources: say how to weigh "
            f"them in {p}.mixture, e.g. {{{', '.join(f'{n}: 0.5' for n in extra)}}}",
        )
    if rm.overlap.num_chunks > 1 and not (rm.mixture or judge.enable or on["remote"]):
        c.error(
            f"{p}.overlap.num_chunks",
            f"{p}.overlap.num_chunks={rm.overlap.num_chunks}: overlap scores the judge, remote "
            "and mixture rewards; the rules and the reward model are scored after generation "
            "(set it to 1, or use one of those sources)",
        )


def check_rewards(c: Checks, cfg: TrainerConfig) -> None:
    rm, p = cfg.reward_model, "reward_model"
    if rm.max_abs_reward == float("inf"):
        c.error(f"{p}.max_abs_reward", f"{p}.max_abs_reward=inf: must be a finite bound")
    if rm.clip_range is not None and (
        len(rm.clip_range) != 2 or rm.clip_range[0] >= rm.clip_range[1]
    ):
        c.error(
            f"{p}.clip_range",
            f"{p}.clip_range={show(rm.clip_range)}: must be [lo, hi] with lo < hi",
        )
    if rm.enable and rm.model.path is None:
        c.error(
            (f"{p}.enable", f"{p}.model.path"),
            f"{p}.enable=true: {p}.model.path is null; give the reward model's path",
        )
    if rm.enable:
        c.model(f"{p}.model", rm.model)
    check_reward_sources(c, rm, p)  # judge, remote service, mixture, overlap
    ob = rm.overlong_buffer
    if ob.enable and not 1 <= ob.len <= cfg.data.max_response_length:
        c.error(
            (f"{p}.overlong_buffer.len", "data.max_response_length"),
            f"{p}.overlong_buffer.len={ob.len}: must be in [1, data.max_response_length="
            f"{cfg.data.max_response_length}] when the overlong buffer is enabled",
        )
    fn, p = cfg.custom_reward_function, "custom_reward_function"
    if fn.path is not None:
        c.file(f"{p}.path", fn.path, "reward function file")
    if not fn.name.isidentifier():
        c.error(f"{p}.name", f"{p}.name={show(fn.name)}: must be a Python function name")
