"""Skipping the old-log-prob pass changes nothing: with one optimizer step per batch, an
update that uses its own detached log-probs as the old ones gets the same loss, the same
gradients (within 1e-6) and the same entropy / rollout-drift metrics as an update after the
separate ``compute_log_prob`` pass."""

from __future__ import annotations

import copy

import pytest
import torch

from verl.config import load_config
from verl.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny_model_dir
from verl.protocol import DataProto
from verl.trainer.lifecycle.metrics import compute_data_metrics, compute_rollout_mismatch_metrics
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.specs import actor_rollout_ref_spec

P, R = 6, 5
PROMPT_LENS = [6, 2, 4, 3, 5, 1]
RESPONSE_LENS = [5, 3, 1, 0, 4, 2]
ROWS = len(PROMPT_LENS)
TOL = 1e-6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", arch="qwen2")


def _batch() -> DataProto:
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 200, (ROWS, P + R), generator=gen)
    mask = torch.zeros(ROWS, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS, strict=True)):
        mask[i, P - p : P + r] = 1
    ids = ids * mask
    response_mask = mask[:, P:].float()
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
        "prompts": ids[:, :P],
        "responses": ids[:, P:],
        "response_mask": response_mask,
        "advantages": torch.randn(ROWS, R, generator=gen) * response_mask,
        # a rollout that sampled with slightly different numerics
        "rollout_log_probs": -2.0 + 0.05 * torch.randn(ROWS, R, generator=gen),
        "token_level_scores": torch.zeros(ROWS, R),
        "token_level_rewards": torch.zeros(ROWS, R),
    }
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 0.8})


def _config(model_dir, *extra: str):
    a = "actor_rollout_ref.actor"
    return load_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            "trainer.device=cpu",
            "trainer.mixed_precision=none",  # fp32 on any CPU
            "data.train_batch_size=3",
            f"data.max_prompt_length={P}",
            f"data.max_response_length={R}",
            "actor_rollout_ref.rollout.n=2",
            f"{a}.ppo_mini_batch_size=3",  # one mini-batch of all six rows
            f"{a}.ppo_micro_batch_size_per_device=2",  # three micro-batches
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_device=4",
            f"{a}.shuffle=true",
            f"{a}.rollout_is_threshold=1.05",
            f"{a}.logprob_chunk_size=3",
            *extra,
        ]
    )


def _update(cfg, module, data: DataProto, with_pass: bool):
    worker = ActorRolloutRefWorker(
        actor_rollout_ref_spec(cfg, role="actor_rollout"),
        module=module,
        tokenizer=build_tiny_tokenizer(),
    )
    worker.init_model(total_steps=1)
    captured = []
    step = worker.engine.optimizer_step

    def recording_step():
        captured.append([p.grad.detach().clone() for p in worker.engine.module.parameters()])
        return step()

    worker.engine.optimizer_step = recording_step
    pass_metrics = {}
    if with_pass:
        data = data.union(worker.compute_log_prob(data))
        pass_metrics = compute_rollout_mismatch_metrics(data)
        pass_metrics |= {
            k: v for k, v in compute_data_metrics(data, R).items() if k == "actor/entropy"
        }
    metrics = worker.update_actor(data)
    assert len(captured) == 1
    return captured[0], metrics, pass_metrics


@pytest.mark.parametrize("entropy_coeff", [0.0, 0.01])
def test_skipped_pass_gives_the_same_loss_gradients_and_metrics(model_dir, entropy_coeff):
    cfg = _config(model_dir, f"actor_rollout_ref.actor.entropy_coeff={entropy_coeff}")
    torch.manual_seed(0)
    module = build_tiny_model()
    want_grads, want, pass_metrics = _update(cfg, copy.deepcopy(module), _batch(), True)
    got_grads, got, _ = _update(cfg, module, _batch(), with_pass=False)

    worst = max(float((g - w).abs().max()) for g, w in zip(got_grads, want_grads))
    assert worst <= TOL, f"gradients differ by {worst:.3g}"
    assert max(float(w.abs().max()) for w in want_grads) > 1e-3
    for key in ("actor/pg_loss", "actor/rollout_is_weight_mean", "actor/grad_norm"):
        assert got[key] == pytest.approx(want[key], abs=TOL), key
    # the ratio is 1 by construction, as the recomputed pass makes it
    assert got["actor/approx_kl"] == pytest.approx(0.0, abs=TOL)
    assert got["actor/clipfrac"] == 0.0
    # the metrics the pass fed come from the update's forward, with the same values
    for key, value in pass_metrics.items():
        assert got[key] == pytest.approx(value, abs=1e-5), key
    assert "rollout/logprob_abs_diff_mean" in got and "actor/entropy" in got


def test_no_old_log_probs_with_several_optimizer_steps_is_an_error(model_dir):
    cfg = _config(model_dir, "actor_rollout_ref.actor.ppo_epochs=2")
    torch.manual_seed(0)
    worker = ActorRolloutRefWorker(
        actor_rollout_ref_spec(cfg, role="actor_rollout"),
        module=build_tiny_model(),
        tokenizer=build_tiny_tokenizer(),
    )
    worker.init_model(total_steps=1)
    with pytest.raises(ValueError, match="ppo_epochs=2"):
        worker.update_actor(_batch())
