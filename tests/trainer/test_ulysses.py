"""Ulysses sequence parallelism in the RL loop: two GRPO steps on 2 Ray ranks with
``actor.ulysses_sequence_parallel_size=2`` (one sequence group: each rank computes half of
every sequence's tokens) against the same run in one process, and a resume of its step-1
checkpoint in one process (a changed mesh).

The rollouts come from a file (``data.rollout_files``, written by ``verl generate``), so
every run trains on the same samples whatever its ranks; the runs must then agree within
1e-5 (fp32): the step metrics and the exported weights.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from verl import cli
from verl.data.arithmetic import write_arithmetic_dataset
from verl.trainer.rl.trainer import RLTrainer

pytestmark = pytest.mark.slow

TOL = 1e-5
COMMON = (
    "actor_rollout_ref.actor.rollout_is_threshold=2.0",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.kl_loss_coef=0.1",
    "actor_rollout_ref.actor.entropy_coeff=0.01",
    "actor_rollout_ref.actor.optim.lr=1e-2",
    # Adam divides by sqrt(v) + eps: with eps 1e-8 an entry whose gradient is ~0 takes a
    # step of about lr * sign(rounding noise), so float rounding between layouts (1e-7 in
    # the gradients) would show in the weights at ~1e-5; a larger eps keeps the comparison
    # about the sequence-parallel numerics
    "actor_rollout_ref.actor.optim.eps=1e-4",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "trainer.device=cpu",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=1",
)
COMPARED = (
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/grad_norm",
    "actor/clipfrac",
    "actor/approx_kl",
)


@pytest.fixture
def rollout_file(tiny_model_dir, tmp_path):
    """``verl generate``: 8 arithmetic prompts x 2 sampled responses of <= 6 tokens, scored
    1 and 0 (the tiny random model answers none right: equal scores would leave GRPO no
    advantage)."""
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


def _assert_steps_equal(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want, strict=True), start=1):
        for key in COMPARED:
            assert key in g and key in w, key
            assert abs(g[key] - w[key]) <= TOL * max(1.0, abs(w[key])), (step, key)
    assert all(w["actor/grad_norm"] > 0 and w["actor/pg_loss"] != 0 for w in want)


def _assert_weights_equal(got: dict, want: dict, start: dict) -> None:
    # (a multi-rank export may also write the tied lm_head.weight: the embedding matrix)
    assert want.keys() <= got.keys()
    for name, tensor in want.items():
        worst = float((got[name] - tensor).abs().max())
        assert worst <= TOL, f"{name}: differs by {worst:.3g}"
    assert any(not torch.equal(want[n], start[n]) for n in want), "training changed nothing"


def test_grpo_with_sequence_parallelism_equals_one_process_and_resumes_on_one(
    rl_config, ray_session, rollout_file, tiny_model_dir, tmp_path
):
    data = f"data.rollout_files=[{rollout_file}]"
    _, want, want_result = _fit(rl_config, tmp_path / "one", data, "trainer.n_gpus_per_node=1")
    assert len(want) == 2

    sp_trainer, got, got_result = _fit(
        rl_config,
        tmp_path / "sp",
        data,
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
    )
    assert sp_trainer.placement.backend == "ray"
    assert sp_trainer.actor_rollout_wg.world_size == 2
    start = load_file(f"{tiny_model_dir}/model.safetensors")
    _assert_steps_equal(got, want)
    _assert_weights_equal(_weights(got_result), _weights(want_result), start)

    # the sequence-parallel run's step-1 checkpoint (2 ranks, one sequence group), resumed
    # by one process: its step 2 is the one-process run's step 2
    resumed_trainer, resumed, resumed_result = _fit(
        rl_config,
        tmp_path / "resumed",
        data,
        "trainer.n_gpus_per_node=1",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={tmp_path / 'sp' / 'global_step_1'}",
    )
    assert resumed_trainer.global_step == 2
    _assert_steps_equal(resumed[-1:], want[-1:])
    _assert_weights_equal(_weights(resumed_result), _weights(want_result), start)


def test_an_upstream_style_script_with_sequence_parallelism_trains(
    ray_session, tiny_model_dir, tmp_path, capsys, caplog
):
    """Upstream's run-script keys with ``ulysses_sequence_parallel_size=2`` for the actor,
    the reference and the critic and ``rollout.tensor_model_parallel_size=2``, through
    ``main_ppo`` as a shell passes them: two GAE steps with a KL loss on 2 ranks,
    checkpointed and exported; the rollout's tensor size (vLLM's, unused by the native
    rollout) gets a warning naming the actor's own key."""
    from verl.cli import ppo as main_ppo

    run = tmp_path / "run"
    argv = [
        "--config-path=config",
        "--config-name=ppo_trainer",
        "algorithm.adv_estimator=gae",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.rollout.name=native",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2",
        "critic.model.use_remove_padding=True",
        "critic.ppo_mini_batch_size=4",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "critic.ulysses_sequence_parallel_size=2",
        "critic.optim.lr=1e-3",
        "data.train_batch_size=4",
        "data.max_response_length=6",
        "data.arithmetic.train_size=16",
        "data.arithmetic.val_size=4",
        "trainer.n_gpus_per_node=2",
        "trainer.nnodes=1",
        "trainer.device=cpu",
        "trainer.total_training_steps=2",
        "trainer.save_freq=2",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.logger=['console']",
        "trainer.mixed_precision=none",
        f"trainer.default_local_dir={run}",
        f"trainer.log_dir={run}",
    ]
    assert main_ppo.main(argv) == 0, capsys.readouterr().err[-3000:]
    dropped = [
        r.getMessage() for r in caplog.records if "tensor_model_parallel_size" in r.getMessage()
    ]
    assert any("actor_rollout_ref.actor.tensor_parallel_size" in m for m in dropped), dropped
    for role in ("actor", "critic"):
        state = json.loads((run / "global_step_2" / role / "engine_state.json").read_text())
        assert state["world_size"] == 2 and state["sequence_parallel_size"] == 2, role
    assert (run / "huggingface" / "model.safetensors").is_file()
