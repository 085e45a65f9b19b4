"""GKD-style mixing for distillation (``algorithm.distill.fixed_fraction``,
:mod:`verl.trainer.rl.distill_mix`): the per-step choice (seeded, resumable), the fixed
responses' batch (exact ids and mask), the top-k loss on it by hand, the refusals, and a
two-step ``verl distill`` run that mixes both kinds of step."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from verl import cli
from verl.algorithms.distill import distill_loss
from verl.config import ConfigError, load_config
from verl.data.rl_dataset import collate_fn
from verl.models.tiny import build_tiny_tokenizer, save_tiny_model_dir
from verl.protocol import DataProto
from verl.trainer.rl.distill_mix import (
    FIXED_METRIC,
    MixedDistillSource,
    distill_kind_metrics,
    fixed_response_batch,
    fixed_response_texts,
    is_fixed_step,
)
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.specs import actor_rollout_ref_spec

from .test_distill_e2e import EXAMPLE, SHORT  # two short steps on the tiny model

R = 6  # data.max_response_length
PROMPTS = [[5, 9, 11], [7, 8], [13, 4, 6, 10]]
ANSWERS = ["7", "123", "a b"]
EXTRA = [{"response": a, "op": "+"} for a in ANSWERS]


def _prompts(extra=EXTRA) -> DataProto:
    items = [
        {
            "input_ids": torch.tensor(ids),
            "raw_prompt": [{"role": "user", "content": "q"}],
            "data_source": "arithmetic",
            "ground_truth": answer,
            "extra_info": dict(info),
            "index": 10 + i,
        }
        for i, (ids, answer, info) in enumerate(zip(PROMPTS, ANSWERS, extra))
    ]
    return collate_fn(items, pad_token_id=0)


# ---------------------------------------------------------------- the choice of step


def test_choice_is_a_function_of_seed_and_step():
    seq = [is_fixed_step(7, step, 0.5) for step in range(1, 401)]
    assert seq == [is_fixed_step(7, step, 0.5) for step in range(1, 401)]  # reproducible
    assert seq != [is_fixed_step(8, step, 0.5) for step in range(1, 401)]  # seeded
    assert 0.42 < np.mean(seq) < 0.58  # the fraction asked for
    assert np.mean([is_fixed_step(7, s, 0.2) for s in range(1, 2001)]) == pytest.approx(
        0.2, abs=0.03
    )
    assert not any(is_fixed_step(7, s, 0.0) for s in range(1, 50))  # on-policy only
    assert all(is_fixed_step(7, s, 1.0) for s in range(1, 50))  # supervised KD


class _Base:
    def __init__(self):
        self.calls = 0

    def next(self, draw):
        self.calls += 1
        return draw(), {"gen": 1.0}


def _source(step_box, seed=3):
    base = _Base()
    source = MixedDistillSource(
        base,
        score=lambda gen, metrics, prompts: (gen, metrics | {"scored": float(len(gen))}),
        step=lambda: step_box[0],
        make_fixed=lambda prompts: fixed_response_batch(
            prompts, ANSWERS, build_tiny_tokenizer(), n=2, max_response_length=R, temperature=1.0
        ),
        seed=seed,
        fraction=0.5,
    )
    return source, base


def test_the_choices_survive_a_resume():
    """A resumed run (a new source, the step counter restored to k) makes the choices the
    uninterrupted run makes after k, whatever it did before."""
    step = [0]
    source, base = _source(step)
    kinds = []
    for k in range(1, 9):
        step[0] = k
        _, metrics = source.next(_prompts)
        kinds.append(metrics[FIXED_METRIC])
    assert kinds == [float(is_fixed_step(3, k, 0.5)) for k in range(1, 9)]
    assert 0 < sum(kinds) < 8  # both kinds occur in these steps
    assert base.calls == kinds.count(0.0)  # a fixed step generates nothing
    resumed_step = [5]
    resumed, _ = _source(resumed_step)
    again = []
    for k in range(5, 9):
        resumed_step[0] = k
        again.append(resumed.next(_prompts)[1][FIXED_METRIC])
    assert again == kinds[4:]


def test_a_fixed_step_is_scored_and_has_group_ids():
    step = [next(k for k in range(1, 50) if is_fixed_step(3, k, 0.5))]
    source, base = _source(step)
    gen, metrics = source.next(_prompts)
    assert base.calls == 0 and metrics["scored"] == 6.0 and metrics[FIXED_METRIC] == 1.0
    uid = gen.non_tensor_batch["uid"]
    assert len(set(uid)) == 3 and uid[0] == uid[1] != uid[2]


def test_kind_metrics_name_the_loss_by_kind():
    assert distill_kind_metrics({FIXED_METRIC: 1.0, "actor/distill_loss": 0.3}) == {
        "distill/loss_fixed": 0.3
    }
    assert distill_kind_metrics({FIXED_METRIC: 0.0, "actor/distill_loss": 0.2}) == {
        "distill/loss_on_policy": 0.2
    }
    assert distill_kind_metrics({"actor/distill_loss": 0.2}) == {}


# ---------------------------------------------------------------- the fixed batch


def test_fixed_rows_hold_the_datasets_response_tokens():
    tok = build_tiny_tokenizer()
    prompts = _prompts()
    texts = fixed_response_texts(prompts, "reward_model", ["ground_truth"])
    assert texts == ANSWERS
    assert fixed_response_texts(prompts, "extra_info", ["response"]) == ANSWERS
    gen = fixed_response_batch(prompts, texts, tok, n=2, max_response_length=R, temperature=0.7)
    assert len(gen) == 6 and "rollout_log_probs" not in gen.batch
    assert gen.meta_info["temperature"] == 0.7
    for row in range(6):
        want = tok(ANSWERS[row // 2], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        length = len(want)
        assert gen.batch["responses"][row, :length].tolist() == want
        assert gen.batch["responses"][row, length:].tolist() == [tok.pad_token_id] * (R - length)
        assert gen.batch["response_mask"][row].tolist() == [1] * length + [0] * (R - length)
        prompt = gen.batch["prompts"][row]
        torch.testing.assert_close(
            gen.batch["input_ids"][row], torch.cat([prompt, gen.batch["responses"][row]])
        )
        assert gen.batch["attention_mask"][row, -R:].tolist() == [1] * length + [0] * (R - length)
    # the prompts' fields, repeated like the rollout repeats rows
    assert list(gen.non_tensor_batch["ground_truth"]) == [a for a in ANSWERS for _ in range(2)]


def test_a_response_longer_than_the_limit_is_cut():
    tok = build_tiny_tokenizer()
    long = "1 2 3 4 5 6 7 8 9"
    gen = fixed_response_batch(
        _prompts(), [long, "7", "8"], tok, n=1, max_response_length=R, temperature=1.0
    )
    assert (
        gen.batch["responses"][0].tolist() == tok(long, add_special_tokens=False)["input_ids"][:R]
    )
    assert gen.batch["response_mask"][0].tolist() == [1] * R


def test_a_missing_response_names_the_row_and_the_keys():
    prompts = _prompts(extra=[{"response": "7"}, {"op": "+"}, {"response": "1"}])
    with pytest.raises(ValueError, match=r"data row 11 .* extra_info\.response"):
        fixed_response_texts(prompts, "extra_info", ["response"])
    with pytest.raises(ValueError, match="response_key=extra_info"):
        fixed_response_texts(prompts, "response", [])
    with pytest.raises(ValueError, match=r"response_dict_keys=\[ground_truth\]"):
        fixed_response_texts(prompts, "reward_model", ["answer"])


# ---------------------------------------------------------------- the loss on fixed rows


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gkd")
    student = save_tiny_model_dir(root / "student", arch="qwen2")
    teacher = save_tiny_model_dir(root / "teacher", arch="qwen2", seed=7, hidden_size=96)
    return student, teacher


def _hand_log_softmax(module, gen, temperature):
    with torch.no_grad():
        logits = module(
            input_ids=gen.batch["input_ids"],
            attention_mask=gen.batch["attention_mask"],
            position_ids=gen.batch["position_ids"],
            use_cache=False,
        ).logits[:, -R - 1 : -1]
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def test_topk_loss_on_fixed_rows_equals_a_hand_computation(model_dirs):
    student_dir, teacher_dir = model_dirs
    k, temperature = 4, 0.8
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={student_dir}",
            "trainer.device=cpu",
            "trainer.mixed_precision=none",
            "data.train_batch_size=3",
            f"data.max_response_length={R}",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=3",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=6",
            "actor_rollout_ref.actor.optim.lr=1e-6",
            "algorithm.distill.enable=true",
            f"algorithm.distill.teacher_path={teacher_dir}",
            "algorithm.distill.estimator=topk",
            f"algorithm.distill.topk={k}",
            "algorithm.distill.fixed_fraction=1.0",
        ]
    )
    torch.manual_seed(0)
    tok = build_tiny_tokenizer()
    worker = ActorRolloutRefWorker(actor_rollout_ref_spec(cfg, role="actor_rollout"), tokenizer=tok)
    worker.init_model(total_steps=2)
    gen = fixed_response_batch(
        _prompts(), ANSWERS, tok, n=2, max_response_length=R, temperature=temperature
    )
    scores = worker.compute_teacher_log_prob(gen)
    s_full = _hand_log_softmax(worker.engine.module, gen, temperature)
    t_full = _hand_log_softmax(worker.teacher_engine.module, gen, temperature)
    mask = gen.batch["response_mask"].float()
    ids = s_full.topk(k, dim=-1).indices
    valid = mask.bool()
    assert torch.equal(scores.batch["distill_topk_ids"][valid], ids[valid])
    torch.testing.assert_close(
        scores.batch["teacher_topk_log_probs"][valid],
        t_full.gather(-1, ids)[valid],
        rtol=1e-4,
        atol=1e-5,
    )
    # by hand: KL of the two distributions coarsened to {top-k ids, the rest}, token-mean
    s, t = s_full.gather(-1, ids).exp().double(), t_full.gather(-1, ids).exp().double()
    s_rest, t_rest = 1 - s.sum(-1), 1 - t.sum(-1)
    per_token = (s * (s.log() - t.log())).sum(-1) + s_rest * (s_rest.log() - t_rest.log())
    hand = float((per_token * mask).sum() / mask.sum())
    assert hand > 0
    loss, _ = distill_loss(
        s_full.gather(-1, ids),
        None,
        mask,
        estimator="topk",
        student_topk_log_probs=s_full.gather(-1, ids),
        teacher_topk_log_probs=scores.batch["teacher_topk_log_probs"],
    )
    assert float(loss) == pytest.approx(hand, rel=1e-4)
    # the update on the fixed rows (no advantages needed by the loss, no rollout log-probs)
    update = gen.union(scores)
    update.batch["advantages"] = torch.zeros_like(mask)
    metrics = worker.update_actor(update)
    assert metrics["actor/distill_loss"] == pytest.approx(hand, rel=1e-3)


# ---------------------------------------------------------------- refusals


def _messages(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(
            overrides=[
                "algorithm.distill.enable=true",
                "algorithm.distill.teacher_path=some/teacher",
                *overrides,
            ]
        )
    return [p.message for p in info.value.problems]


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_sampled_token_estimators_are_refused_with_fixed_responses(estimator):
    text = " ".join(
        _messages(
            "algorithm.distill.fixed_fraction=0.5", f"algorithm.distill.estimator={estimator}"
        )
    )
    assert "algorithm.distill.fixed_fraction=0.5" in text
    assert f"algorithm.distill.estimator={estimator} is biased" in text
    assert "estimator=topk" in text


def test_fixed_responses_refuse_the_task_loss_and_unreachable_keys():
    base = ("algorithm.distill.fixed_fraction=1", "algorithm.distill.estimator=topk")
    text = " ".join(_messages(*base, "algorithm.distill.mix_task_reward=true"))
    assert "mix_task_reward=false" in text and "behaviour" in text
    text = " ".join(_messages(*base, "algorithm.distill.response_key=response"))
    assert "algorithm.distill.response_key=response" in text and "extra_info" in text
    text = " ".join(_messages(*base, "algorithm.distill.response_dict_keys=[answer]"))
    assert "response_dict_keys=[ground_truth]" in text
    text = " ".join(_messages(*base, "algorithm.filter_groups.enable=true"))
    assert "algorithm.filter_groups.enable" in text


def test_on_policy_only_accepts_every_estimator():
    cfg = load_config(
        overrides=["algorithm.distill.estimator=k1", "algorithm.distill.response_key=response"]
    )
    assert cfg.algorithm.distill.fixed_fraction == 0.0


# ---------------------------------------------------------------- end to end


def _distill(teacher, tmp_path, seed, *extra: str) -> list[dict]:
    code = cli.main(
        [
            "distill",
            "--config",
            str(EXAMPLE),
            f"actor_rollout_ref.model.path={teacher.parent / 'student'}",
            f"algorithm.distill.teacher_path={teacher}",
            "algorithm.distill.estimator=topk",
            "algorithm.distill.topk=4",
            "algorithm.distill.fixed_fraction=0.5",
            f"trainer.seed={seed}",
            *SHORT,
            "trainer.save_freq=1",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            f"trainer.log_dir={tmp_path / 'logs'}",
            *extra,
        ]
    )
    assert code == 0
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "actor/distill_loss" in r]


@pytest.mark.slow
def test_verl_distill_mixes_fixed_and_on_policy_steps_and_resumes(tmp_path):
    """Two steps, one of each kind (the seed is picked so); resumed for a third step, the
    run takes the kind the (seed, step) draw names."""
    seed = next(
        s
        for s in range(100)
        if is_fixed_step(s, 1, 0.5) != is_fixed_step(s, 2, 0.5) != is_fixed_step(s, 3, 0.5)
    )
    save_tiny_model_dir(tmp_path / "models" / "student", arch="qwen2")
    teacher = save_tiny_model_dir(tmp_path / "models" / "teacher", arch="qwen2", seed=3)
    trained = _distill(teacher, tmp_path, seed)
    assert [r["step"] for r in trained] == [1, 2]
    trained = _distill(teacher, tmp_path, seed, "trainer.total_training_steps=3")
    assert [r["step"] for r in trained] == [1, 2, 3]  # resumed after step 2: one more step
    for r in trained:
        fixed = is_fixed_step(seed, r["step"], 0.5)
        assert r[FIXED_METRIC] == float(fixed)
        key = "distill/loss_fixed" if fixed else "distill/loss_on_policy"
        assert r[key] == r["actor/distill_loss"] > 0
