"""The distillation teacher in the actor worker (algorithm.distill): its scores of the
student's samples, the update's distillation term, the frozen teacher, the tokenizer check."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from verl.config import load_config
from verl.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny_model_dir
from verl.protocol import DataProto
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.specs import actor_rollout_ref_spec
from verl.workers.teacher import check_same_tokenizer

P, R = 6, 5
PROMPT_LENS = [6, 2, 4, 3, 5, 1]
RESPONSE_LENS = [5, 3, 1, 2, 4, 2]
ROWS = len(PROMPT_LENS)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", arch="qwen2")


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory):
    """A teacher with the student's tokenizer, another width and other (random) weights."""
    return save_tiny_model_dir(
        tmp_path_factory.mktemp("tiny_teacher") / "model", arch="qwen2", seed=7, hidden_size=96
    )


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
        "response_mask": response_mask,
        "advantages": torch.randn(ROWS, R, generator=gen) * response_mask,
    }
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 0.8})


def _worker(model_dir, teacher_dir, *extra: str) -> ActorRolloutRefWorker:
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            "trainer.device=cpu",
            "trainer.mixed_precision=none",
            "data.train_batch_size=3",
            f"data.max_prompt_length={P}",
            f"data.max_response_length={R}",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=3",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_device=4",
            "actor_rollout_ref.actor.optim.lr=1e-2",
            "algorithm.distill.enable=true",
            f"algorithm.distill.teacher_path={teacher_dir}",
            "algorithm.distill.topk=4",
            *extra,
        ]
    )
    torch.manual_seed(0)
    worker = ActorRolloutRefWorker(
        actor_rollout_ref_spec(cfg, role="actor_rollout"), tokenizer=build_tiny_tokenizer()
    )
    worker.init_model(total_steps=4)
    return worker


@pytest.mark.parametrize("estimator", ["k1", "k3", "topk"])
def test_teacher_equal_to_student_gives_zero_loss(model_dir, estimator):
    worker = _worker(model_dir, model_dir, f"algorithm.distill.estimator={estimator}")
    data = _batch()
    data = data.union(worker.compute_log_prob(data))
    teacher = worker.compute_teacher_log_prob(data)
    mask = data.batch["response_mask"].bool()
    torch.testing.assert_close(
        teacher.batch["teacher_log_probs"][mask], data.batch["old_log_probs"][mask]
    )
    if estimator == "topk":
        ids = teacher.batch["distill_topk_ids"]
        assert ids.shape == (ROWS, R, 4) and ids.dtype == torch.long
        assert teacher.batch["teacher_topk_log_probs"].shape == (ROWS, R, 4)
    metrics = worker.update_actor(data.union(teacher))
    assert metrics["actor/distill_loss"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["actor/distill_k1"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("estimator", ["k3", "topk"])
def test_distillation_moves_the_student_and_never_the_teacher(
    model_dir, other_model_dir, estimator
):
    worker = _worker(
        model_dir,
        other_model_dir,
        f"algorithm.distill.estimator={estimator}",
        "algorithm.distill.coef=1.0",
        "actor_rollout_ref.actor.optim.lr=1e-3",
    )
    teacher_module = worker.teacher_engine.module
    before = copy.deepcopy(teacher_module.state_dict())
    student_before = copy.deepcopy(worker.engine.module.state_dict())
    data = _batch()
    data = data.union(worker.compute_log_prob(data))
    data = data.union(worker.compute_teacher_log_prob(data))
    losses = []
    for _ in range(4):  # the same samples: the KL to the teacher on them falls
        metrics = worker.update_actor(data)
        losses.append(metrics["actor/distill_loss"])
    assert losses[-1] < losses[0], losses
    assert metrics["actor/distill_coef"] == 1.0
    for name, param in teacher_module.named_parameters():
        assert param.grad is None, name
        assert not param.requires_grad, name
        torch.testing.assert_close(param.detach(), before[name], rtol=0, atol=0)
    moved = any(
        not torch.equal(p.detach(), student_before[n])
        for n, p in worker.engine.module.named_parameters()
    )
    assert moved


def test_distill_alone_ignores_the_task_advantages(model_dir):
    """mix_task_reward=false: the advantages add nothing to the gradient (teacher ==
    student, so the distillation gradient is 0 up to rounding); mixed, they do."""
    grads = {}
    for mix, scale in ((False, 0.0), (False, 5.0), (True, 5.0)):
        worker = _worker(model_dir, model_dir, f"algorithm.distill.mix_task_reward={mix}")
        data = _batch()
        data.batch["advantages"] = data.batch["advantages"] * scale
        data = data.union(worker.compute_log_prob(data))
        data = data.union(worker.compute_teacher_log_prob(data))
        grads[mix, scale] = worker.update_actor(data)["actor/grad_norm"]
    assert grads[False, 0.0] < 1e-5 and grads[False, 5.0] < 1e-5, grads
    assert grads[True, 5.0] > 1e-3, grads


def test_teacher_pass_without_a_teacher_names_the_keys(model_dir):
    worker = _worker(model_dir, model_dir)
    worker.teacher_engine = None
    with pytest.raises(RuntimeError, match=r"algorithm\.distill\.enable"):
        worker.compute_teacher_log_prob(_batch())


def test_a_different_tokenizer_is_refused_naming_both_paths():
    student = build_tiny_tokenizer()
    teacher = copy.deepcopy(student)
    teacher.add_tokens(["<extra_teacher_token>"])
    with pytest.raises(ValueError, match=r"teacher_dir.*student_dir"):
        check_same_tokenizer(student, teacher, "student_dir", "teacher_dir")
    check_same_tokenizer(student, copy.deepcopy(student), "student_dir", "teacher_dir")


def test_worker_refuses_a_teacher_with_another_tokenizer(model_dir, tmp_path):
    teacher_dir = tmp_path / "teacher"
    build_tiny_model().save_pretrained(teacher_dir)
    tok = build_tiny_tokenizer()
    tok.add_tokens(["<only_in_teacher>"])
    tok.save_pretrained(teacher_dir)
    with pytest.raises(ValueError, match=re.escape(str(teacher_dir))):
        _worker(model_dir, teacher_dir)


@pytest.mark.parametrize("precision", ["bf16", "fp8", "int4"])
def test_teacher_in_a_reduced_precision_scores_close_to_fp32(model_dir, other_model_dir, precision):
    data = _batch()
    want = _worker(model_dir, other_model_dir).compute_teacher_log_prob(data)
    worker = _worker(model_dir, other_model_dir, f"algorithm.distill.teacher_precision={precision}")
    assert not any(p.requires_grad for p in worker.teacher_engine.module.parameters())
    got = worker.compute_teacher_log_prob(data)
    mask = data.batch["response_mask"].bool()
    w, g = want.batch["teacher_log_probs"][mask], got.batch["teacher_log_probs"][mask]
    assert torch.isfinite(g).all()
    # rounded (measured: bf16 2e-3, fp8 2e-2, int4 7e-2 at most), not a different model
    assert 0 < (g - w).abs().max().item() < 0.2, (precision, (g - w).abs().max().item())
