"""Values derived from a config: the one place each "null means ..." default is resolved.

Code elsewhere calls these helpers instead of re-deriving (``critic.enable=None`` means
"on iff the estimator needs values", ``clip_ratio_low=None`` means ``clip_ratio``, ...).
What an algorithm needs is asked of its registry entry (``verl.registry``), never of a list
of names kept here.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

from verl.config.device_map import DeviceMap, resolve_device_map
from verl.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES

if TYPE_CHECKING:  # schema imports the modules that import this one
    from verl.config.schema import ActorConfig, TrainerConfig

# Fields a directory template may name, e.g. "checkpoints/{project_name}/{experiment_name}".
PATH_FIELDS = ("project_name", "experiment_name")


def world_size(cfg: TrainerConfig) -> int:
    """Devices in the cluster: ``nnodes * n_gpus_per_node`` (see ``dp_size`` per role)."""
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def placed_roles(cfg: TrainerConfig) -> list[str]:
    """The model-holding roles this run places on devices, in placement order."""
    roles = ["actor_rollout_ref"]
    if critic_enabled(cfg):
        roles.append("critic")
    if cfg.reward_model.enable:
        roles.append("reward_model")
    return roles


def device_map(cfg: TrainerConfig) -> DeviceMap:
    """The run's placement (``resource_pool`` over the cluster) for its placed roles.

    Raises ``DeviceMapError`` for a map that cannot be placed (``validate`` reports the same
    problems with their keys first).
    """
    t = cfg.trainer
    return resolve_device_map(cfg.resource_pool, t.nnodes, t.n_gpus_per_node, placed_roles(cfg))


def dp_size(cfg: TrainerConfig, role: str) -> int:
    """Data-parallel ranks of ``role`` (``actor_rollout_ref``, ``critic``, ``reward_model``)."""
    return device_map(cfg).dp_size(role)


def engine_strategy(cfg: TrainerConfig, role: str) -> str:
    """The train engine of ``role``: its ``strategy``, with auto = fsdp2 iff > 1 rank."""
    section = cfg.actor_rollout_ref.actor if role == "actor_rollout_ref" else cfg.critic
    if section.strategy != "auto":
        return section.strategy
    return "fsdp2" if dp_size(cfg, role) > 1 else "single"


def worker_backend(cfg: TrainerConfig) -> str:
    """``trainer.backend``, with auto = ray iff the roles need more than one process."""
    if cfg.trainer.backend != "auto":
        return cfg.trainer.backend
    return "ray" if device_map(cfg).processes > 1 else "local"


def critic_enabled(cfg: TrainerConfig) -> bool:
    """``critic.enable``, or when null, whether ``algorithm.adv_estimator`` needs values."""
    if cfg.critic.enable is not None:
        return cfg.critic.enable
    return estimator_needs(cfg, "needs_critic")


def estimator_needs(cfg: TrainerConfig, what: str) -> bool:
    """Whether ``algorithm.adv_estimator``'s registry entry declares ``what``
    (``needs_critic``, ``needs_index``, ``needs_baseline``, ``needs_reference``); False for
    an unregistered name, which ``validate`` reports."""
    return bool(ADVANTAGE_ESTIMATORS.needs(cfg.algorithm.adv_estimator, what))


def ref_enabled(cfg: TrainerConfig) -> bool:
    """A reference policy is needed iff a KL term is on (in the loss or in the reward) or the
    advantage estimator needs reference log-probs."""
    return (
        cfg.actor_rollout_ref.actor.use_kl_loss
        or cfg.algorithm.use_kl_in_reward
        or estimator_needs(cfg, "needs_reference")
    )


def clip_ratio_bounds(actor: ActorConfig) -> tuple[float, float]:
    """``(eps_low, eps_high)``: the ratio is clipped to ``[1 - eps_low, 1 + eps_high]``."""
    low = actor.clip_ratio if actor.clip_ratio_low is None else actor.clip_ratio_low
    high = actor.clip_ratio if actor.clip_ratio_high is None else actor.clip_ratio_high
    return low, high


def actor_loss_agg_mode(actor: ActorConfig) -> str:
    """``actor.loss_agg_mode``, or when null the mode the policy loss's registry entry
    prefers (``default_loss_agg_mode``: GSPO's is ``seq-mean-token-mean``), else
    ``token-mean``."""
    if actor.loss_agg_mode is not None:
        return actor.loss_agg_mode
    return POLICY_LOSSES.needs(actor.policy_loss, "default_loss_agg_mode", None) or "token-mean"


def critic_model_path(cfg: TrainerConfig) -> str:
    """``critic.model.path``, or the actor's model path when null."""
    return cfg.critic.model.path or cfg.actor_rollout_ref.model.path


def tokenizer_path(cfg: TrainerConfig) -> str:
    """The policy tokenizer: ``model.tokenizer_path`` or ``model.path``."""
    model = cfg.actor_rollout_ref.model
    return model.tokenizer_path or model.path


def rollout_seed(cfg: TrainerConfig) -> int:
    """``rollout.seed``, or ``trainer.seed`` when null."""
    seed = cfg.actor_rollout_ref.rollout.seed
    return cfg.trainer.seed if seed is None else seed


def template_fields(template: str) -> list[str]:
    """The ``{name}`` fields a directory template uses (raises ValueError if malformed)."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


def format_dir(template: str, cfg: TrainerConfig) -> str:
    """Fill ``{project_name}`` / ``{experiment_name}`` in a ``trainer`` directory template."""
    return template.format(**{k: getattr(cfg.trainer, k) for k in PATH_FIELDS})


def checkpoint_dir(cfg: TrainerConfig) -> str:
    """``trainer.default_local_dir`` with its fields filled in."""
    return format_dir(cfg.trainer.default_local_dir, cfg)


def log_dir(cfg: TrainerConfig) -> str:
    """``trainer.log_dir`` with its fields filled in."""
    return format_dir(cfg.trainer.log_dir, cfg)
