"""Tensor parallelism in the RL loop: GRPO on 2 Ray ranks with
``actor.tensor_parallel_size=2`` (one tensor group: both ranks hold half of every layer's
heads and MLP width and compute the same rows) against the same run in one process, its
step-1 checkpoint resumed at ``data=2`` (2 ranks, no tensor parallelism) and in one process,
and its HuggingFace export loaded by transformers; PPO with the critic at ``tensor=2`` as
well, against one process and (its step-1 checkpoint) resumed at ``data=2`` and in one
process.

The tiny Qwen2 has 4 query / 2 key/value heads. The first test trains on rollouts from a
file (``data.rollout_files``, as the Ulysses test), so every run trains on the same samples
whatever its ranks; the second generates its own (the tensor group samples its joined
prompts together from its weight shards). Runs must agree within 1e-5 (fp32): the step
metrics and the exported weights.

The stored rollouts and the PPO run at ``tensor=2`` are made once for the module (the two PPO
tests assert on the same run): the tests run on the session's Ray cluster, in one worker.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from verl import cli
from verl.config import load_config
from verl.data.arithmetic import write_arithmetic_dataset
from verl.trainer.rl.trainer import RLTrainer

from .conftest import BASE_OVERRIDES

pytestmark = pytest.mark.slow

TOL = 1e-5
TP = "actor_rollout_ref.actor.tensor_parallel_size=2"
COMMON = (
    # one optimizer step per training step: a data=2 layout then updates on the same rows
    # (each mini-batch is the step's whole batch) as one process
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.kl_loss_coef=0.1",
    "actor_rollout_ref.actor.entropy_coeff=0.01",
    "actor_rollout_ref.actor.optim.lr=1e-2",
    # Adam's eps above the gradients' rounding (1e-7 between layouts): with 1e-8 an entry
    # whose gradient is ~0 would step by ~lr in a direction set by the rounding
    "actor_rollout_ref.actor.optim.eps=1e-4",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "trainer.mixed_precision=none",
    "trainer.device=cpu",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=1",
)
COMPARED = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm")


@pytest.fixture(scope="module")
def rollout_file(tiny_model_dir, tmp_path_factory):
    """``verl generate``: 8 arithmetic prompts x 2 sampled responses of <= 6 tokens, scored
    1 and 0 (GRPO then has an advantage to follow)."""
    tmp_path = tmp_path_factory.mktemp("rollouts")
    train, _ = write_arithmetic_dataset(tmp_path / "data", 8, 2, 1, ["+"], 0, "parquet", "chat")
    out = tmp_path / "gens.parquet"
    args = ["generate", "--model", str(tiny_model_dir), "--data", str(train), "--n", "2"]
    args += ["--max-new-tokens", "6", "--seed", "3", "-o", str(out)]
    assert cli.main(args) == 0
    rows = pq.read_table(out).to_pylist()
    for row in rows:
        row["scores"] = [1.0, 0.0]
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out


def _fit(rl_config, run_dir, *extra):
    trainer = RLTrainer(rl_config(*COMMON, f"trainer.default_local_dir={run_dir}", *extra))
    try:
        result = trainer.fit()
        return trainer, list(trainer.history), result
    finally:
        trainer.close()


def _weights(result) -> dict[str, torch.Tensor]:
    return load_file(f"{result['hf_dir']}/model.safetensors")


def _assert_steps_equal(got: list[dict], want: list[dict], keys=COMPARED) -> None:
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want, strict=True), start=1):
        for key in keys:
            assert key in g and key in w, key
            assert abs(g[key] - w[key]) <= TOL * max(1.0, abs(w[key])), (step, key, g[key], w[key])
    assert all(w["actor/grad_norm"] > 0 for w in want)


def _assert_weights_equal(got: dict, want: dict, start: dict) -> float:
    """The largest difference; a multi-rank export may also write the tied lm_head."""
    assert want.keys() <= got.keys()
    worst = 0.0
    for name, tensor in want.items():
        assert got[name].shape == tensor.shape, name  # full (gathered) weights
        diff = float((got[name] - tensor).abs().max())
        assert diff <= TOL, f"{name}: differs by {diff:.3g}"
        worst = max(worst, diff)
    assert any(not torch.equal(want[n], start[n]) for n in want), "training changed nothing"
    return worst


def _gae_overrides(rollout_file) -> tuple[str, ...]:
    """PPO with a critic (GAE) on the stored rollouts, critic on FSDP2."""
    return (
        f"data.rollout_files=[{rollout_file}]",
        "actor_rollout_ref.actor.rollout_is_threshold=2.0",
        "algorithm.adv_estimator=gae",
        "critic.strategy=fsdp2",
        "critic.ppo_mini_batch_size=4",
        "critic.ppo_micro_batch_size_per_device=2",
        "critic.optim.lr=1e-2",
        "critic.optim.eps=1e-4",
    )


GAE_TP = ("trainer.n_gpus_per_node=2", TP, "critic.tensor_parallel_size=2")


@pytest.fixture(scope="module")
def gae_tp_run(tiny_model_dir, tmp_path_factory, rollout_file, ray_session):
    """PPO with actor and critic at ``tensor=2``, saved at steps 1 and 2: ``(run_dir,
    history, result)``; the two PPO tests below assert on this one run."""
    tmp = tmp_path_factory.mktemp("gae_tp")

    def module_config(*extra: str):
        return load_config(
            overrides=[
                f"actor_rollout_ref.model.path={tiny_model_dir}",
                *BASE_OVERRIDES,
                f"trainer.default_local_dir={tmp}",
                f"trainer.log_dir={tmp}",
                *extra,
            ]
        )

    _, history, result = _fit(module_config, tmp / "tp", *_gae_overrides(rollout_file), *GAE_TP)
    return tmp / "tp", history, result


def _resumed_on_other_layouts(rl_config, tmp_path, source_dir, *overrides):
    """The step-1 checkpoint under ``source_dir`` resumed at data=2 (2 ranks, whole layers)
    and in one process, each run to step 2 under ``tmp_path``: ``(layout, history, result)``
    each."""
    for layout, ranks in (("dp2", 2), ("one_resumed", 1)):
        trainer, resumed, result = _fit(
            rl_config,
            tmp_path / layout,
            *overrides,
            f"trainer.n_gpus_per_node={ranks}",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={source_dir / 'global_step_1'}",
        )
        assert trainer.global_step == 2, layout
        yield layout, resumed, result


def test_grpo_with_tensor_parallelism_equals_one_process_and_resumes_on_other_layouts(
    rl_config, ray_session, rollout_file, tiny_model_dir, tmp_path
):
    data = (
        f"data.rollout_files=[{rollout_file}]",
        "actor_rollout_ref.actor.rollout_is_threshold=2.0",
    )
    _, want, want_result = _fit(rl_config, tmp_path / "one", *data, "trainer.n_gpus_per_node=1")
    assert len(want) == 2 and all(w["actor/pg_loss"] != 0 for w in want)

    tp_trainer, got, got_result = _fit(
        rl_config, tmp_path / "tp", *data, "trainer.n_gpus_per_node=2", TP
    )
    assert tp_trainer.actor_rollout_wg.world_size == 2
    state = json.loads(
        (tmp_path / "tp" / "global_step_1" / "actor" / "engine_state.json").read_text()
    )
    assert state["world_size"] == 2 and state["tensor_parallel_size"] == 2
    start = load_file(f"{tiny_model_dir}/model.safetensors")
    _assert_steps_equal(got, want)
    _assert_weights_equal(_weights(got_result), _weights(want_result), start)

    # the export is a plain HF model: transformers loads it, and it scores like the weights
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(got_result["hf_dir"], dtype=torch.float32)
    for name, tensor in _weights(want_result).items():
        assert torch.allclose(exported.state_dict()[name], tensor, atol=TOL), name

    # the tensor-parallel step-1 checkpoint resumed at data=2 (2 ranks, whole layers) and in
    # one process: each one's step 2 is the one-process run's step 2
    layouts = _resumed_on_other_layouts(rl_config, tmp_path, tmp_path / "tp", *data)
    for _layout, resumed, result in layouts:
        _assert_steps_equal(resumed[-1:], want[-1:])
        _assert_weights_equal(_weights(result), _weights(want_result), start)


def test_grpo_generating_from_tensor_parallel_shards_equals_one_process(
    rl_config, ray_session, tiny_model_dir, tmp_path
):
    """Live rollouts: the tensor group generates its joined prompts with the seed of its
    data-parallel rank, so its samples (and everything after) are the one process's."""
    live = ("actor_rollout_ref.rollout.name=native", "actor_rollout_ref.rollout.seed=5")
    runs = {}
    for name, extra in (
        ("one", ("trainer.n_gpus_per_node=1",)),
        ("tp", ("trainer.n_gpus_per_node=2", TP)),
    ):
        dump = f"trainer.rollout_data_dir={tmp_path / name / 'rollouts'}"
        runs[name] = _fit(rl_config, tmp_path / name, *live, dump, *extra)
    (_, want, want_result), (_, got, got_result) = runs["one"], runs["tp"]
    # the same sampled responses, step by step (each step's rollouts in prompt order)
    for step in (1, 2):
        rows = {
            name: [
                json.loads(line)
                for line in (tmp_path / name / "rollouts" / f"{step}.jsonl")
                .read_text()
                .splitlines()
            ]
            for name in runs
        }
        assert len(rows["one"]) == 8
        assert [r["response"] for r in rows["tp"]] == [r["response"] for r in rows["one"]]
    state = json.loads(
        (tmp_path / "tp" / "global_step_2" / "actor" / "engine_state.json").read_text()
    )
    assert state["world_size"] == 2 and state["tensor_parallel_size"] == 2
    keys = ("response_length/mean", "response_length/max", "actor/entropy", "actor/kl_loss")
    _assert_steps_equal(got, want, keys=(*keys, "actor/grad_norm"))
    start = load_file(f"{tiny_model_dir}/model.safetensors")
    _assert_weights_equal(_weights(got_result), _weights(want_result), start)


def test_gae_with_a_tensor_parallel_critic_equals_one_process(
    rl_config, ray_session, rollout_file, gae_tp_run, tmp_path
):
    """PPO with a critic: the actor and the value model (body split, value head replicated)
    both at ``tensor=2``; the values, value losses and the actor's update are the one
    process's."""
    gae = _gae_overrides(rollout_file)
    _, want, _ = _fit(rl_config, tmp_path / "one", *gae, "trainer.n_gpus_per_node=1")
    tp_dir, got, _ = gae_tp_run
    state = json.loads((tp_dir / "global_step_1" / "critic" / "engine_state.json").read_text())
    assert state["world_size"] == 2 and state["tensor_parallel_size"] == 2
    critic = ("critic/vf_loss", "critic/vpred_mean", "critic/grad_norm")
    _assert_steps_equal(got, want, keys=(*COMPARED, *critic))
    assert all(w["critic/grad_norm"] > 0 for w in want)


def _critic_weights(run_dir, step: int) -> dict[str, torch.Tensor]:
    """The critic's full (unsharded) weights from its step-``step`` DCP checkpoint."""
    from verl.engine.dcp_io import read_dcp_tensors

    found = {}
    for path in sorted((run_dir / f"global_step_{step}" / "critic").rglob(".metadata")):
        found.update(read_dcp_tensors(str(path.parent), "model"))
    assert found, f"no critic weights under {run_dir}"
    return found


def test_gae_tensor_parallel_checkpoint_resumes_on_other_layouts(
    rl_config, ray_session, rollout_file, gae_tp_run, tiny_model_dir, tmp_path
):
    """Actor and critic at ``tensor=2`` saved at step 1, resumed at ``data=2`` and in one
    process: step 2's value loss, values and gradient norms, the actor's exported weights and
    the critic's checkpointed weights equal the uninterrupted ``tensor=2`` run's."""
    gae = _gae_overrides(rollout_file)
    tp_dir, want, want_result = gae_tp_run
    critic_start = _critic_weights(tp_dir, 1)
    critic_want = _critic_weights(tp_dir, 2)
    assert any(not torch.equal(critic_want[n], critic_start[n]) for n in critic_want)
    critic = ("critic/vf_loss", "critic/vpred_mean", "critic/grad_norm")
    start = load_file(f"{tiny_model_dir}/model.safetensors")
    # the model's own tensors (a multi-rank export may also write the tied lm_head)
    actor_want = {n: t for n, t in _weights(want_result).items() if n in start}
    for layout, resumed, result in _resumed_on_other_layouts(rl_config, tmp_path, tp_dir, *gae):
        _assert_steps_equal(resumed[-1:], want[-1:], keys=(*COMPARED, *critic))
        actor_diff = _assert_weights_equal(_weights(result), actor_want, start)
        got = _critic_weights(tmp_path / layout, 2)
        assert got.keys() == critic_want.keys(), layout
        assert any(name.startswith("value_head") for name in got), sorted(got)
        critic_diff = 0.0
        for name, tensor in critic_want.items():
            diff = float((got[name] - tensor).abs().max())
            assert diff <= TOL, f"{layout} critic {name}: differs by {diff:.3g}"
            critic_diff = max(critic_diff, diff)
        metric_diff = {k: abs(resumed[-1][k] - want[-1][k]) for k in critic}
        print(f"{layout}: actor {actor_diff:.2g}, critic {critic_diff:.2g}, {metric_diff}")
