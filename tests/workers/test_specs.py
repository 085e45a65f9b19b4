"""Role specs and loss bindings: built once from the config, picklable, and the bound losses
compute exactly what a direct call with the settings computes."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest
import torch

import verl
from verl.algorithms.losses import actor_loss, critic_loss
from verl.config import TrainerConfig, load_config
from verl.engine.options import EngineOptions
from verl.registry import POLICY_LOSSES
from verl.workers.critic import CriticWorker
from verl.workers.losses import bind_actor_loss, bind_value_loss
from verl.workers.reward_model import RewardModelWorker
from verl.workers.specs import (
    actor_rollout_ref_spec,
    critic_spec,
    reward_model_spec,
    rollout_copy_spec,
)

ROOT = Path(verl.__file__).parent


def _config(*overrides: str) -> TrainerConfig:
    return load_config(
        overrides=[
            "trainer.device=cpu",
            "trainer.mixed_precision=bf16",
            "algorithm.adv_estimator=gae",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.clip_ratio_high=0.28",
            "data.max_response_length=7",
            *overrides,
        ]
    )


def test_specs_round_trip_through_pickle_and_hold_resolved_values():
    cfg = _config()
    specs = [
        actor_rollout_ref_spec(cfg),
        critic_spec(cfg),
        reward_model_spec(cfg),
        rollout_copy_spec(cfg),
    ]
    for spec in specs:
        assert pickle.loads(pickle.dumps(spec)) == spec
    actor = specs[0]
    assert actor.role == "actor_rollout_ref" and actor.ref is not None
    assert (actor.actor.loss.clip_ratio_low, actor.actor.loss.clip_ratio_high) == (0.2, 0.28)
    assert actor.actor.loss.loss_scale_factor == 7  # null: data.max_response_length
    assert actor.actor.engine == EngineOptions(
        grad_clip=1.0, autocast_dtype="bf16", max_consecutive_nonfinite=3
    )
    assert actor.ref.engine.param_dtype == "bf16" and actor.ref.engine.grad_clip is None
    assert specs[1].loss.loss_scale_factor == 7
    copy = specs[3]
    assert copy.role == "actor_rollout" and copy.ref is None and copy.actor.strategy == "single"
    with pytest.raises(ValueError, match="role='critic'"):
        actor_rollout_ref_spec(cfg, role="critic")


def test_a_worker_given_the_config_tree_names_the_spec_builder():
    cfg = _config()
    with pytest.raises(TypeError, match=r"verl\.workers\.specs\.critic_spec\(config\)"):
        CriticWorker(cfg)
    with pytest.raises(TypeError, match=r"reward_model_spec\(config\)"):
        RewardModelWorker(cfg)


def _micro_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict]:
    gen = torch.Generator().manual_seed(seed)
    shape = (3, 5)
    log_prob = torch.randn(shape, generator=gen).requires_grad_(True)
    old = torch.randn(shape, generator=gen)
    mask = (torch.rand(shape, generator=gen) > 0.2).float()
    batch = {
        "advantages": torch.randn(shape, generator=gen),
        "response_mask": mask,
        "ref_log_probs": torch.randn(shape, generator=gen),
        "values": torch.randn(shape, generator=gen),
        "returns": torch.randn(shape, generator=gen),
    }
    return log_prob, old, batch


def test_bound_actor_loss_equals_the_direct_call_bit_for_bit():
    spec = actor_rollout_ref_spec(_config("actor_rollout_ref.actor.entropy_coeff=0.01")).actor.loss
    loss = bind_actor_loss(spec)
    log_prob, old, batch = _micro_batch()
    entropy = torch.rand(log_prob.shape)
    got, got_metrics = loss(log_prob, old, batch, entropy=entropy)
    got.backward()
    got_grad, log_prob.grad = log_prob.grad.clone(), None

    entry = POLICY_LOSSES.entry(spec.policy_loss)
    want, want_metrics = actor_loss(
        log_prob,
        old,
        batch["advantages"],
        batch["response_mask"],
        policy_loss_fn=entry.target,
        policy_loss_kwargs=entry.call_kwargs(
            {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": spec.clip_ratio_c}
        ),
        loss_agg_mode=spec.loss_agg_mode,
        loss_scale_factor=7,
        entropy=entropy,
        entropy_coeff=0.01,
        ref_log_prob=batch["ref_log_probs"],
        kl_loss_coef=spec.kl_loss_coef,
        kl_loss_type=spec.kl_loss_type,
    )
    want.backward()
    assert torch.equal(got, want) and torch.equal(got_grad, log_prob.grad)
    assert got_metrics.keys() == want_metrics.keys()
    for key in want_metrics:
        assert torch.equal(torch.as_tensor(got_metrics[key]), torch.as_tensor(want_metrics[key]))


def test_bound_value_loss_equals_the_direct_call():
    spec = critic_spec(_config("critic.cliprange_value=0.3")).loss
    vpreds, _, batch = _micro_batch(1)
    got, _ = bind_value_loss(spec)(vpreds, batch)
    want, _ = critic_loss(
        vpreds,
        batch["values"],
        batch["returns"],
        batch["response_mask"],
        cliprange_value=0.3,
        loss_agg_mode="token-mean",
        loss_coef=1.0,
        loss_scale_factor=7,
    )
    assert torch.equal(got, want)


def test_policy_loss_kwargs_are_checked_when_the_loss_is_bound():
    spec = actor_rollout_ref_spec(_config()).actor.loss
    bad = type(spec)(**{**spec.__dict__, "policy_loss_kwargs": {"no_such_knob": 1}})
    with pytest.raises(ValueError, match="no_such_knob"):
        bind_actor_loss(bad)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The verl modules among ``modules`` that ``path`` imports (functions included,
    ``if TYPE_CHECKING:`` blocks left out; ``from pkg import x`` imports ``pkg``)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.orelse:
                    visit_one(stmt)
                continue
            visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        visit(node)

    visit(ast.parse(path.read_text()))
    return found & modules


def test_no_import_cycle_between_the_files_of_workers_and_engine():
    files = [*ROOT.glob("workers/*.py"), *ROOT.glob("engine/*.py")]

    def name(p: Path) -> str:
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name(p): p for p in files}
    graph = {m: _imports(p, set(modules)) for m, p in modules.items()}
    state: dict[str, int] = {}  # 1 = on the path, 2 = done

    def walk(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                walk(dep, [*path, dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
    assert "verl.engine.options" in graph["verl.engine.base"]  # the walk sees the edges
