"""The config checks of an RL run (``TrainerConfig``): every cross-field check, each problem
naming the keys, the value and the fix.

:data:`RL_CONFIG_CHECKS` is registered in ``verl.registry.CONFIG_CHECKS`` under
``TrainerConfig``, so ``load_config`` and ``cfg.validate()`` (``verl.config.validate``) run
these checks without the config importing the trainer. Before checking, :func:`resolve_rl_config`
writes on the config itself what it leaves unsaid: the role precision keys the trainer-wide
keys fill (``verl.compat.precision_keys``) and what asynchronous training needs
(``async_checks``). The feature checks live beside this module: asynchronous rollouts
(``async_checks``), precisions (``precision_checks``), rewards (``reward_checks``), tensor
parallelism (``parallel_checks``; a vLLM rollout's own: ``vllm_parallel_checks``; the
sequence-parallel size is checked here,
:func:`check_sequence_parallel`). The list of checks is kept in ``docs/config.md``
("Validation").
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from verl.compat.precision_keys import fill_role_precisions
from verl.config.device_map import ROLE_DEVICE_KEYS, device_map_problems
from verl.config.load import ConfigProblem
from verl.config.validate import ConfigChecks
from verl.registry import ADVANTAGE_ESTIMATORS, DISTILL_ESTIMATORS, ROLLOUT_BACKENDS
from verl.trainer.config_checks import (
    Checks,
    check_data_source,
    check_optim,
    check_registries,
    check_run,
    divisors,
)
from verl.trainer.rl.async_checks import check_async_rollout, resolve_async_rollout
from verl.trainer.rl.distill_pool import check_teacher_pool
from verl.trainer.rl.parallel_checks import check_tensor_parallel
from verl.trainer.rl.precision_checks import precision_problems, precision_warnings
from verl.trainer.rl.registry_checks import registry_problems
from verl.trainer.rl.reward_checks import check_rewards
from verl.trainer.rl.vllm_parallel_checks import check_vllm_tensor_parallel
from verl.utils.yaml_text import show

if TYPE_CHECKING:
    from verl.config.schema import TrainerConfig

__all__ = ["RL_CONFIG_CHECKS", "check_sequence_parallel", "resolve_rl_config", "semantic_problems"]


def semantic_problems(
    cfg: TrainerConfig,
    *,
    registries: Mapping[str, Iterable[str]] | None = None,
    skip_paths: Collection[str] = (),
) -> tuple[list[ConfigProblem], list[str]]:
    """Run every check on a well-typed tree; skip checks that involve ``skip_paths``."""
    checks = Checks(skip_paths)
    inactive = [] if cfg.critic_enabled else ["critic"]
    if cfg.data.train_files or cfg.data.builtin != "arithmetic":
        inactive.append("data.arithmetic")
    checks.fields(cfg, inactive=inactive)
    for check in (
        _check_device_map,
        _check_data,
        _check_actor_rollout_ref,
        _check_critic,
        check_rewards,
        _check_algorithm,
        _check_trainer,
        _check_precision,
    ):
        check(checks, cfg)
    for keys, message in registry_problems(cfg, skip=registries or {}):
        checks.error(keys, message)
    check_registries(checks, cfg, registries)
    return checks.problems, checks.warnings


def _check_data(c: Checks, cfg: TrainerConfig) -> None:
    d = cfg.data
    uses_builtin = not d.train_files and d.builtin == "arithmetic"
    check_data_source(c, d, uses_builtin)
    if uses_builtin:
        a = d.arithmetic
        if a.train_size < d.train_batch_size:
            c.error(
                ("data.arithmetic.train_size", "data.train_batch_size"),
                f"data.arithmetic.train_size={a.train_size}: fewer prompts than one batch "
                f"(data.train_batch_size={d.train_batch_size}); raise it or lower the batch",
            )
    if d.rollout_files:
        _check_rollout_files(c, cfg)
    if d.dataloader_num_workers == 0 and (d.persistent_workers or d.prefetch_factor is not None):
        c.error(
            ("data.dataloader_num_workers", "data.persistent_workers", "data.prefetch_factor"),
            f"data.persistent_workers={show(d.persistent_workers)}, data.prefetch_factor="
            f"{show(d.prefetch_factor)} need loader workers: set data.dataloader_num_workers "
            ">= 1, or drop them",
        )
    if d.dataloader_num_workers > 0 and d.truncation == "drop":
        c.error(
            ("data.dataloader_num_workers", "data.truncation"),
            "data.truncation=drop with data.dataloader_num_workers > 0: the workers read rows "
            "lazily, and dropping one would change the number of prompts after the batches "
            "are planned; use truncation=error or truncate, or dataloader_num_workers=0",
        )
    has_val = bool(d.val_files) or (uses_builtin and d.arithmetic.val_size > 0)
    if not has_val and (cfg.trainer.val_before_train or cfg.trainer.test_freq > 0):
        c.warn("no validation data (data.val_files is empty): validation will be skipped")


def _check_rollout_files(c: Checks, cfg: TrainerConfig) -> None:
    """Training from pre-generated rollouts (verl.data.rollout_file): the files exist, the
    prompts come from them alone, and their log-probs enter the loss as the behaviour
    policy's, which the rollout correction does."""
    d, actor = cfg.data, cfg.actor_rollout_ref.actor
    for f in d.rollout_files:
        c.file("data.rollout_files", f)
    if d.train_files:
        c.error(
            ("data.rollout_files", "data.train_files"),
            "data.rollout_files and data.train_files are both set: the training prompts are "
            "the rollout files' rows; drop data.train_files (data.val_files still validates)",
        )
    if actor.rollout_is_threshold is None and actor.rollout_rs_threshold is None:
        c.error(
            ("data.rollout_files", "actor_rollout_ref.actor.rollout_is_threshold"),
            "data.rollout_files: the stored responses come from the policy that generated "
            "them, not the one being trained; set actor_rollout_ref.actor.rollout_is_threshold "
            "(e.g. 2.0) so that each token's loss is weighted by "
            "min(exp(old_log_prob - stored log_prob), threshold)",
        )
    if cfg.estimator_needs("needs_baseline"):
        c.error(
            ("data.rollout_files", "algorithm.adv_estimator"),
            f"data.rollout_files with algorithm.adv_estimator={cfg.algorithm.adv_estimator}: "
            "its baseline is a greedy response generated at train time, which an offline run "
            "does not generate; use grpo, rloo, reinforce_plus_plus or gae",
        )


def _device_map_problems(cfg: TrainerConfig) -> list[tuple[tuple[str, ...], str]] | None:
    """The device map's problems; None when the cluster size is invalid (reported apart)."""
    t = cfg.trainer
    if t.nnodes < 1 or t.n_gpus_per_node < 1:
        return None
    return device_map_problems(cfg.resource_pool, t.nnodes, t.n_gpus_per_node, cfg.placed_roles)


def _dp_sizes(cfg: TrainerConfig) -> dict[str, int] | None:
    """Data-parallel size per placed role, or None when the device map is invalid."""
    if _device_map_problems(cfg) != []:
        return None
    return {role: cfg.device_map.dp_size(role) for role in cfg.placed_roles}


def _dp_keys(role_name: str) -> tuple[str, ...]:
    return (
        f"resource_pool.{ROLE_DEVICE_KEYS[role_name]}",
        "trainer.nnodes",
        "trainer.n_gpus_per_node",
    )


def _check_device_map(c: Checks, cfg: TrainerConfig) -> None:
    """Device ids in range, lists identical or disjoint; the backend can host the map."""
    t, problems = cfg.trainer, _device_map_problems(cfg)
    for keys, message in problems or []:
        c.error(keys, message)
    if problems != []:
        return  # a bad cluster size is reported by the field bounds
    placed = cfg.device_map
    if t.backend == "local" and placed.processes > 1:
        c.error(
            ("trainer.backend", "resource_pool", "trainer.n_gpus_per_node"),
            f"trainer.backend=local runs every role in this one process, but the device map "
            f"needs {placed.processes} worker processes ({_describe_pools(placed)}); use "
            "trainer.backend=ray (or auto)",
        )
    unused = sorted(
        set(range(placed.num_devices)) - {d for ids in placed.pools.values() for d in ids}
    )
    if unused:
        c.warn(f"device(s) {unused} of the cluster are not used by any role (resource_pool)")


def _describe_pools(placed: Any) -> str:
    return "; ".join(
        f"{'+'.join(placed.roles_in_pool(name))} on devices {list(ids)}"
        for name, ids in placed.pools.items()
    )


def _check_ppo_batches(
    c: Checks, cfg: TrainerConfig, prefix: str, role: Any, role_name: str
) -> None:
    """Mini-batches split the step's prompts; micro-batches split a device's mini-batch
    (a row count when one is set, else the token budget: ``role.uses_token_budget``)."""
    mini, micro = role.ppo_mini_batch_size, role.ppo_micro_batch_size_per_device
    mini_key, micro_key = (
        f"{prefix}.ppo_mini_batch_size",
        f"{prefix}.ppo_micro_batch_size_per_device",
    )
    if role.use_dynamic_bsz is False and micro is None:
        c.error(
            (f"{prefix}.use_dynamic_bsz", micro_key),
            f"{prefix}.use_dynamic_bsz=false: row-count micro-batches need {micro_key} "
            f"(samples per forward/backward), which is null; set it, or leave use_dynamic_bsz "
            f"null to use the token budget {prefix}.ppo_max_token_len_per_device",
        )
        return
    n, batch = cfg.actor_rollout_ref.rollout.n, cfg.data.train_batch_size
    sizes = _dp_sizes(cfg)
    if mini < 1 or (micro is not None and micro < 1) or n < 1 or batch < 1 or sizes is None:
        return  # reported above
    ws = sizes[role_name]
    if batch % mini:
        c.error(
            (mini_key, "data.train_batch_size"),
            f"{mini_key}={mini}: does not divide data.train_batch_size={batch} (prompts per "
            f"step); use one of {divisors(batch)}",
        )
        return
    samples = mini * n
    n_key, dev_keys = "actor_rollout_ref.rollout.n", _dp_keys(role_name)
    if samples % ws:
        c.error(
            (mini_key, n_key, *dev_keys),
            f"{mini_key}={mini}: {mini} prompts x rollout.n={n} = {samples} samples per "
            f"optimizer step do not split over the {ws} data-parallel ranks of {role_name} "
            f"({dev_keys[0]}, or trainer.nnodes x trainer.n_gpus_per_node); make "
            f"mini-batch x n a multiple of {ws}",
        )
        return
    per_device = samples // ws
    if not role.uses_token_budget and per_device % micro:
        c.error(
            (micro_key, mini_key, n_key, *dev_keys),
            f"{micro_key}={micro}: does not divide the {per_device} samples per device per "
            f"optimizer step ({mini_key}={mini} x rollout.n={n} / {ws} devices); use one of "
            f"{divisors(per_device)}",
        )
    budget = role.ppo_max_token_len_per_device
    if role.uses_token_budget and budget is not None:  # the default lets long samples go alone
        longest = cfg.data.max_prompt_length + cfg.data.max_response_length
        if budget < longest:
            c.error(
                (f"{prefix}.ppo_max_token_len_per_device", "data.max_prompt_length"),
                f"{prefix}.ppo_max_token_len_per_device={role.ppo_max_token_len_per_device}: "
                f"smaller than one sample (max_prompt_length + max_response_length = "
                f"{longest}); raise it to at least {longest}",
            )


def _check_engine(c: Checks, cfg: TrainerConfig, prefix: str, role: Any, role_name: str) -> None:
    sizes = _dp_sizes(cfg)
    ws = sizes[role_name] if sizes else 1
    if role.strategy == "single" and ws > 1:
        c.error(
            (f"{prefix}.strategy", *_dp_keys(role_name)),
            f"{prefix}.strategy=single: trains in one process but {role_name} has {ws} "
            f"data-parallel ranks; use {prefix}.strategy=fsdp2 (or auto)",
        )
    if role.strategy == "single" and role.fsdp_config.mixed_precision is not None:
        c.warn(
            f"{prefix}.fsdp_config.mixed_precision: strategy=single uses only its param_dtype "
            "(as the role's precision); reduce_dtype and buffer_dtype are FSDP2's"
        )
    check_optim(c, f"{prefix}.optim", role.optim)
    check_sequence_parallel(c, prefix, role.ulysses_sequence_parallel_size, role, role_name, ws)
    check_tensor_parallel(c, cfg, prefix, role, role_name, ws, _dp_keys(role_name))


def check_sequence_parallel(
    c: Checks, prefix: str, size: int, role: Any, role_name: str, ranks: int
) -> None:
    """``{prefix}.ulysses_sequence_parallel_size``: divides the role's ranks, on the fsdp2
    engine (the model's heads are checked when the engine is built)."""
    if size <= 1:
        return
    key = f"{prefix}.ulysses_sequence_parallel_size"
    if ranks % size:
        c.error(
            (key, *_dp_keys(role_name)),
            f"{key}={size}: sequence parallelism splits each micro-batch over {size} ranks, "
            f"which must divide the {ranks} ranks of {role_name}; use one of "
            f"{divisors(ranks)}",
        )
    if role.strategy == "single":
        c.error(
            (key, f"{prefix}.strategy"),
            f"{key}={size}: sequence parallelism needs the fsdp2 engine, but "
            f"{prefix}.strategy=single; use fsdp2 (or auto)",
        )


def _check_sampling(c: Checks, prefix: str, s: Any) -> None:
    if s.do_sample and s.temperature == 0:
        c.error(
            (f"{prefix}.temperature", f"{prefix}.do_sample"),
            f"{prefix}.temperature=0 with {prefix}.do_sample=true: sampling needs a positive "
            f"temperature; set {prefix}.do_sample=false for greedy decoding",
        )


def _check_actor_rollout_ref(c: Checks, cfg: TrainerConfig) -> None:
    arr, device = cfg.actor_rollout_ref, cfg.trainer.device
    c.model("actor_rollout_ref.model", arr.model)
    a, p = arr.actor, "actor_rollout_ref.actor"
    _check_ppo_batches(c, cfg, p, a, "actor_rollout_ref")
    _check_engine(c, cfg, p, a, "actor_rollout_ref")
    ref_sp = arr.ref.ulysses_sequence_parallel_size
    if ref_sp is not None:
        sizes = _dp_sizes(cfg)
        ranks = sizes["actor_rollout_ref"] if sizes else 1
        check_sequence_parallel(c, "actor_rollout_ref.ref", ref_sp, a, "actor_rollout_ref", ranks)
    low = a.clip_ratio if a.clip_ratio_low is None else a.clip_ratio_low
    if not 0 < low < 1:
        key = f"{p}.clip_ratio_low" if a.clip_ratio_low is not None else f"{p}.clip_ratio"
        c.error(key, f"{key}={show(low)}: the lower clip epsilon must be in (0, 1)")

    _check_inert_ratio_terms(c, cfg)

    r, p = arr.rollout, "actor_rollout_ref.rollout"
    _check_sampling(c, p, r)
    _check_sampling(c, f"{p}.val_kwargs", r.val_kwargs)
    if any(not s for s in r.stop):
        c.error(f"{p}.stop", f"{p}.stop={show(r.stop)}: stop strings must not be empty")
    backend = ROLLOUT_BACKENDS.info(r.name) if r.name in ROLLOUT_BACKENDS else {}
    if backend.get("needs_cuda") and device == "cpu":
        c.error(
            (f"{p}.name", "trainer.device"),
            f"{p}.name={r.name}: needs CUDA but trainer.device=cpu; use native or hf on CPU",
        )
    if backend.get("package"):
        package = backend["package"]
        install = backend.get("install") or f"pip install {package}"
        c.package(f"{p}.name", r.name, package, f"{install}, or use native or hf")
    check_vllm_tensor_parallel(c, cfg)
    _check_shared_engine_multi_turn(c, cfg)
    if device == "cpu" and "fp16" in (arr.model.dtype, cfg.critic.model.dtype):
        c.warn("fp16 on trainer.device=cpu is slow and numerically fragile; prefer bf16 or fp32")


def _check_inert_ratio_terms(c: Checks, cfg: TrainerConfig) -> None:
    """A warning for the ratio terms a run cannot use: with one optimizer step per batch the
    update's ratio to the old policy is exactly 1 (the old log-probs are that step's own,
    detached), so clipping (clip-higher included) never acts and KL-Cov's ``|log r|`` has no
    gradient."""
    a, p, batch = cfg.actor_rollout_ref.actor, "actor_rollout_ref.actor", cfg.data.train_batch_size
    if a.ppo_epochs != 1 or a.ppo_mini_batch_size < batch:
        return
    inert = [
        f"{p}.{k}={show(v)}"
        for k in ("clip_ratio_low", "clip_ratio_high")
        if (v := getattr(a, k)) is not None
    ]
    if a.policy_loss == "kl_cov":
        inert.append(f"{p}.policy_loss=kl_cov")
    if inert:
        c.warn(
            f"{', '.join(inert)} has no effect in this run: each batch makes one optimizer step "
            f"({p}.ppo_epochs=1, ppo_mini_batch_size={a.ppo_mini_batch_size} >= "
            f"data.train_batch_size={batch}), where the ratio to the old policy is 1, so "
            "nothing is clipped or penalised; it acts from a batch's second step on (a smaller "
            "ppo_mini_batch_size, or ppo_epochs > 1)"
        )


def _check_shared_engine_multi_turn(c: Checks, cfg: TrainerConfig) -> None:
    """A serving engine (vllm, sglang: ``owns_weights``) on more than one actor rank is one
    engine that serves every rank in lock step; the agent loop's per-rank turns cannot use
    it. Refused here, before any model loads (the worker would refuse it after)."""
    r, p = cfg.actor_rollout_ref.rollout, "actor_rollout_ref.rollout"
    features = [f"{p}.{k}.enable" for k in ("multi_turn", "agent") if getattr(r, k).enable]
    sizes = _dp_sizes(cfg)
    ranks = sizes["actor_rollout_ref"] if sizes else 1
    if not features or ranks <= 1 or r.name not in ROLLOUT_BACKENDS:
        return
    try:
        owns_weights = bool(ROLLOUT_BACKENDS.get(r.name).owns_weights)
    except Exception:  # an engine that cannot be imported here is reported elsewhere
        return
    if owns_weights:
        c.error(
            (f"{p}.name", features[0], "trainer.n_gpus_per_node", "resource_pool.actor_devices"),
            f"{p}.name={r.name} with {features[0]}=true on {ranks} actor ranks: that engine "
            "serves all ranks from one process in lock step, and the agent loop's turns run "
            "per rank, so it cannot take them; use one actor rank "
            "(trainer.n_gpus_per_node=1 or resource_pool.actor_devices=[0]), or "
            f"{p}.name=native (any number of ranks)",
        )


def _check_critic(c: Checks, cfg: TrainerConfig) -> None:
    est, needs_critic = cfg.algorithm.adv_estimator, cfg.estimator_needs("needs_critic")
    if cfg.critic.enable is False and needs_critic:
        c.error(
            ("critic.enable", "algorithm.adv_estimator"),
            f"critic.enable=false: algorithm.adv_estimator={est} needs a value function; "
            "set critic.enable=true (or null for auto) or pick an estimator without a critic",
        )
    if cfg.critic.enable and not needs_critic and est in ADVANTAGE_ESTIMATORS:
        c.warn(f"critic.enable=true but algorithm.adv_estimator={est} does not use values")
    if not cfg.critic_enabled:
        return
    cr = cfg.critic
    c.model("critic.model", cr.model)
    _check_ppo_batches(c, cfg, "critic", cr, "critic")
    _check_engine(c, cfg, "critic", cr, "critic")


def _check_algorithm(c: Checks, cfg: TrainerConfig) -> None:
    al = cfg.algorithm
    n = cfg.actor_rollout_ref.rollout.n
    if cfg.estimator_needs("needs_index") and n == 1:
        c.warn(
            f"algorithm.adv_estimator={al.adv_estimator} with actor_rollout_ref.rollout.n=1: a "
            "group of one response has zero advantage, nothing is learned; set rollout.n >= 2"
        )
    if al.use_kl_in_reward and cfg.actor_rollout_ref.actor.use_kl_loss:
        c.warn(
            "algorithm.use_kl_in_reward=true and actor_rollout_ref.actor.use_kl_loss=true: "
            "the KL to the reference is penalised twice"
        )
    _check_filter_groups(c, cfg)
    _check_distill(c, cfg)


def _check_distill(c: Checks, cfg: TrainerConfig) -> None:
    """On-policy distillation needs a teacher and a known estimator; ``topk`` scores the
    full logits of each micro-batch, which the sequence-parallel path does not produce."""
    d, p = cfg.algorithm.distill, "algorithm.distill"
    check_teacher_pool(c, cfg)  # teacher_pool / resource_pool.teacher_devices
    if not d.enable:
        return
    if not d.teacher_path:
        c.error(
            (f"{p}.teacher_path", f"{p}.enable"),
            f"{p}.enable=true needs {p}.teacher_path: a HF causal LM with the student's "
            "tokenizer (e.g. the model a previous run exported)",
        )
    elif os.path.isabs(d.teacher_path) or d.teacher_path.startswith("."):
        c.file(f"{p}.teacher_path", d.teacher_path, "teacher model directory")
    if d.estimator not in DISTILL_ESTIMATORS:
        names = ", ".join(DISTILL_ESTIMATORS.names())
        c.error(f"{p}.estimator", f"{p}.estimator={show(d.estimator)}: must be one of {names}")
    if d.teacher_precision == "auto":
        c.error(
            f"{p}.teacher_precision",
            f"{p}.teacher_precision=auto: name the teacher's precision (none, fp32, bf16, "
            "fp16, fp8, int4)",
        )
    actor = cfg.actor_rollout_ref.actor
    if DISTILL_ESTIMATORS.needs(d.estimator, "needs_topk") and (
        (actor.ulysses_sequence_parallel_size or 1) > 1
    ):
        c.error(
            (f"{p}.estimator", "actor_rollout_ref.actor.ulysses_sequence_parallel_size"),
            f"{p}.estimator={d.estimator} computes each micro-batch's full logits, which "
            "sequence parallelism does not gather; use estimator=k1 or k3, or "
            "ulysses_sequence_parallel_size=1",
        )
    if d.coef == 0 and not d.mix_task_reward:
        c.warn(
            f"{p}.coef=0 and {p}.mix_task_reward=false: the actor's loss is 0, nothing is learned"
        )
    if d.fixed_fraction > 0:
        _check_distill_fixed(c, cfg)


def _check_distill_fixed(c: Checks, cfg: TrainerConfig) -> None:
    """GKD mixing (``fixed_fraction > 0``, :mod:`verl.trainer.rl.distill_mix`): fixed
    responses are not the student's samples and have no behaviour log-probs, and a fixed step
    replaces the whole generation of a plain batch source."""
    d, p = cfg.algorithm.distill, "algorithm.distill"
    f = f"{p}.fixed_fraction={d.fixed_fraction:g}"
    if not DISTILL_ESTIMATORS.needs(d.estimator, "needs_topk"):
        c.error(
            (f"{p}.fixed_fraction", f"{p}.estimator"),
            f"{f} trains on fixed responses, which are not samples of the student: the "
            f"sampled-token estimator {p}.estimator={d.estimator} is biased on them; use "
            f"{p}.estimator=topk (the full-distribution KL over the student's top-k) or "
            f"{p}.fixed_fraction=0",
        )
    if d.mix_task_reward:
        c.error(
            (f"{p}.fixed_fraction", f"{p}.mix_task_reward"),
            f"{f} with {p}.mix_task_reward=true: fixed responses have no behaviour "
            f"log-probs, so the task's policy loss has no importance ratio on them; set "
            f"{p}.mix_task_reward=false (the distillation loss alone)",
        )
    keys = list(d.response_dict_keys)
    if d.response_key not in ("reward_model", "extra_info"):
        c.error(
            f"{p}.response_key",
            f"{p}.response_key={show(d.response_key)}: the prompt rows bring reward_model "
            "(its ground_truth) and extra_info to the trainer; put the fixed response in one "
            "of them (e.g. response_key=extra_info, response_dict_keys=[response])",
        )
    elif d.response_key == "reward_model" and keys != ["ground_truth"]:
        c.error(
            f"{p}.response_dict_keys",
            f"{p}.response_key=reward_model with response_dict_keys={keys}: only "
            "reward_model.ground_truth reaches the trainer; use response_dict_keys=[ground_truth]",
        )
    elif d.response_key == "extra_info" and not keys:
        c.error(
            f"{p}.response_dict_keys",
            f"{p}.response_key=extra_info needs response_dict_keys naming the response's key "
            "in extra_info (e.g. [response])",
        )
    rollout, trainer = cfg.actor_rollout_ref.rollout, cfg.trainer
    plain = {
        "trainer.async_rollout": trainer.async_rollout,
        "algorithm.filter_groups.enable": cfg.algorithm.filter_groups.enable,
        "data.rollout_files": bool(cfg.data.rollout_files),
        "actor_rollout_ref.rollout.multi_turn.enable": rollout.multi_turn.enable,
        "actor_rollout_ref.rollout.agent.enable": rollout.agent.enable,
    }
    for key, on in plain.items():
        if on:
            c.error(
                (f"{p}.fixed_fraction", key),
                f"{f} mixes fixed responses into single-turn batches generated one step at a "
                f"time; it does not combine with {key}",
            )


def _check_filter_groups(c: Checks, cfg: TrainerConfig) -> None:
    """DAPO dynamic sampling compares the responses of a group: it needs groups."""
    fg, p = cfg.algorithm.filter_groups, "algorithm.filter_groups"
    if not fg.enable:
        return
    est, n = cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.rollout.n
    if est in ADVANTAGE_ESTIMATORS and not cfg.estimator_needs("needs_index"):
        groups = [e for e in ADVANTAGE_ESTIMATORS if ADVANTAGE_ESTIMATORS.info(e)["needs_index"]]
        c.error(
            (f"{p}.enable", "algorithm.adv_estimator"),
            f"{p}.enable=true: algorithm.adv_estimator={est} is not a group estimator; "
            f"dynamic sampling drops groups with equal rewards, which only group baselines "
            f"make useless; use one of {', '.join(groups)}",
        )
    if n < 2:
        c.error(
            (f"{p}.enable", "actor_rollout_ref.rollout.n"),
            f"{p}.enable=true: actor_rollout_ref.rollout.n={n}; a group of one response is "
            "always dropped, so no step could be filled; set rollout.n >= 2",
        )
    if cfg.reward_model.enable and fg.metric != "seq_reward":
        c.error(
            (f"{p}.metric", "reward_model.enable"),
            f"{p}.metric={fg.metric}: reward-model scores carry no {fg.metric}; use "
            f"{p}.metric=seq_reward with reward_model.enable=true",
        )


def _check_precision(c: Checks, cfg: TrainerConfig) -> None:
    """Per-role precision against each other and the device (``precision_checks``)."""
    if _dp_sizes(cfg) is None:
        return  # the device map is wrong; the engines of the roles are unknown
    for keys, message in precision_problems(cfg):
        c.error(keys, message)
    for message in precision_warnings(cfg):
        c.warn(message)


def _check_trainer(c: Checks, cfg: TrainerConfig) -> None:
    t, p = cfg.trainer, "trainer"
    check_run(c, t, p)
    check_async_rollout(c, cfg)
    if t.critic_warmup > 0 and not cfg.critic_enabled:
        c.error(
            (f"{p}.critic_warmup", "algorithm.adv_estimator"),
            f"{p}.critic_warmup={t.critic_warmup}: the run has no critic "
            f"(algorithm.adv_estimator={cfg.algorithm.adv_estimator}); set it to 0",
        )
    if t.nnodes > 1 and t.backend == "local":
        c.error(
            (f"{p}.nnodes", f"{p}.backend"),
            f"{p}.nnodes={t.nnodes}: several machines need {p}.backend=ray (or auto)",
        )
    if t.backend == "ray" or (_dp_sizes(cfg) is not None and cfg.worker_backend == "ray"):
        c.package(f"{p}.backend", "ray", "ray", "pip install 'verl[ray]' or use backend=local")


def resolve_rl_config(cfg: TrainerConfig) -> None:
    """In place, before the checks: the role precision keys filled from the trainer-wide
    keys, and the rollout correction and pipeline depth of asynchronous training."""
    fill_role_precisions(cfg)
    resolve_async_rollout(cfg)


RL_CONFIG_CHECKS = ConfigChecks(problems=semantic_problems, resolve=resolve_rl_config)
