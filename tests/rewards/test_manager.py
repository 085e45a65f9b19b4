"""RewardManager on handmade DataProto batches: placement, metrics, shaping, isolation."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.rewards import (
    OverlongBuffer,
    RewardManager,
    UnknownDataSourceError,
    get_reward_manager,
)

PAD, EOS = 0, 2  # ids of the tiny tokenizer's <|endoftext|> and <|im_end|>


@pytest.fixture(scope="module")
def tokenizer():
    tiny = pytest.importorskip("verl.models.tiny")
    return tiny.build_tiny_tokenizer()


def make_batch(tokenizer, responses, data_sources, truths, response_len=16, eos=True, **extra):
    """Right-padded responses (EOS appended and masked in) plus left-padded prompts."""
    rows, masks = [], []
    for text in responses:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + ([EOS] if eos else [])
        assert len(ids) <= response_len, f"{text!r} needs {len(ids)} tokens"
        rows.append(ids + [PAD] * (response_len - len(ids)))
        masks.append([1] * len(ids) + [0] * (response_len - len(ids)))
    prompts = torch.tensor([[PAD, PAD, 5, 6]] * len(responses))
    prompt_mask = (prompts != PAD).long()
    tensors = {
        "prompts": prompts,
        "responses": torch.tensor(rows),
        "response_mask": torch.tensor(masks),
        "attention_mask": torch.cat([prompt_mask, torch.tensor(masks)], dim=1),
    }
    non_tensors = {"data_source": data_sources, "ground_truth": truths, **extra}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def last_index(batch):
    return batch.batch["response_mask"].sum(-1) - 1


def _custom_from_truth(data_source, solution_str, ground_truth, extra_info=None):
    """Custom reward whose score is simply the ground truth, to test shaping exactly."""
    return float(ground_truth)


def test_builtin_scores_on_last_valid_token(tokenizer):
    texts = ["3 + 4 = 7", "The answer is 12.", "#### 1,234", "no idea", r"\boxed{\frac12}"]
    sources = ["arithmetic", "arithmetic", "openai/gsm8k", "gsm8k", "math"]
    truths = ["7", "13", "1234", "5", r"\frac{1}{2}"]
    batch = make_batch(tokenizer, texts, sources, truths, response_len=20)
    with RewardManager(tokenizer) as manager:
        scores, metrics, extras = manager(batch)
    assert scores.shape == (5, 20) and scores.dtype == torch.float32
    expected = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0])
    assert torch.equal(scores.sum(-1), expected)
    idx = last_index(batch)
    assert torch.equal(scores[torch.arange(5), idx], expected)
    scores[torch.arange(5), idx] = 0
    assert not scores.any()  # nothing anywhere else
    assert extras["pred"].tolist() == ["7", "12", "1234", None, r"\frac{1}{2}"]
    assert extras["score"].tolist() == expected.tolist()
    assert extras["acc"].tolist() == expected.tolist()
    assert extras["data_source"].tolist() == sources
    assert metrics["reward/score_mean"] == pytest.approx(0.6)
    assert (metrics["reward/score_min"], metrics["reward/score_max"]) == (0.0, 1.0)
    assert metrics["reward/acc"] == pytest.approx(0.6)
    assert metrics["reward/acc/arithmetic"] == 0.5
    assert metrics["reward/acc/openai/gsm8k"] == 1.0
    assert metrics["reward/acc/gsm8k"] == 0.0
    assert metrics["reward/acc/math"] == 1.0
    assert metrics["reward/score_mean/arithmetic"] == 0.5
    for kind in ("errors", "timeouts", "non_finite", "invalid_type", "invalid_ground_truth"):
        assert metrics[f"reward/{kind}"] == 0.0
    assert metrics["reward/shaped_score_mean"] == pytest.approx(0.6)


def test_decoding_skips_special_tokens_and_padding(tokenizer):
    batch = make_batch(tokenizer, ["answer: 42"], ["arithmetic"], ["42"])
    seen = []

    def spy(data_source, solution_str, ground_truth, extra_info):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return 1.0

    with RewardManager(tokenizer, compute_score=spy, isolation="inline") as manager:
        manager(batch)
    assert seen == [("arithmetic", "answer: 42", "42", None)]


def test_zero_length_response_scores_at_position_zero(tokenizer):
    batch = make_batch(tokenizer, ["", "so 4"], ["arithmetic"] * 2, ["3", "4"], eos=False)
    batch.batch["responses"][0] = PAD
    fn = _custom_from_truth
    with RewardManager(tokenizer, compute_score=fn, isolation="inline") as manager:
        scores, metrics, _ = manager(batch)
    assert batch.batch["response_mask"][0].sum() == 0
    assert scores[0, 0] == 3.0 and scores[0, 1:].abs().sum() == 0
    assert scores[1, last_index(batch)[1]] == 4.0
    assert metrics["reward/empty_responses"] == 1.0


def test_attention_mask_fallback_and_verl_style_ground_truth(tokenizer):
    batch = make_batch(tokenizer, ["#### 8", "#### 9"], ["gsm8k"] * 2, ["8", "8"])
    tensors = {k: v for k, v in batch.batch.items() if k != "response_mask"}
    non_tensors = {
        "data_source": ["gsm8k", "gsm8k"],
        "reward_model": [{"ground_truth": "8"}, {"ground_truth": "8"}],
    }
    alt = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
    with RewardManager(tokenizer) as manager:
        scores, _, _ = manager(alt)
    assert scores.sum(-1).tolist() == [1.0, 0.0]
    assert scores[0, last_index(batch)[0]] == 1.0


def test_unknown_data_source_and_missing_keys_raise(tokenizer):
    batch = make_batch(tokenizer, ["1"], ["my/new_dataset"], ["1"])
    with RewardManager(tokenizer) as manager:
        with pytest.raises(UnknownDataSourceError, match=r"my/new_dataset.*arithmetic"):
            manager(batch)
        no_truth = DataProto.from_dict(
            tensors=dict(batch.batch), non_tensors={"data_source": ["x"]}
        )
        with pytest.raises(KeyError, match="'ground_truth'"):
            manager(no_truth)


def test_invalid_ground_truth_is_counted(tokenizer, caplog):
    batch = make_batch(tokenizer, ["42", "42", "42"], ["arithmetic"] * 3, ["42", "n/a", ""])
    log_level = caplog.at_level(logging.WARNING, logger="verl.rewards.manager")
    with log_level, RewardManager(tokenizer) as manager:
        scores, metrics, _ = manager(batch)
    assert scores.sum(-1).tolist() == [1.0, 0.0, 0.0]
    assert metrics["reward/invalid_ground_truth"] == 2.0
    assert any("unparseable ground truth 'n/a'" in r.getMessage() for r in caplog.records)


def test_custom_function_failures_are_isolated_and_counted(tokenizer):
    def flaky(data_source, solution_str, ground_truth, extra_info):
        kind = extra_info["kind"]
        if kind == "raise":
            raise RuntimeError("bad sample")
        if kind == "hang":
            while True:
                pass
        return {"ok": 1.0, "nan": math.nan, "str": "1.0", "inf": -math.inf}[kind]

    kinds = ["ok", "raise", "nan", "str", "hang", "inf", "ok"]
    batch = make_batch(
        tokenizer,
        ["x"] * len(kinds),
        ["custom"] * len(kinds),
        ["?"] * len(kinds),
        extra_info=[{"kind": k} for k in kinds],
    )
    with RewardManager(
        tokenizer, compute_score=flaky, timeout_s=0.5, max_failure_rate=None
    ) as manager:
        assert manager._pool is not None  # custom functions run in worker processes
        scores, metrics, extras = manager(batch)
        assert scores.sum(-1).tolist() == [1.0, 0, 0, 0, 0, 0, 1.0]
        assert metrics["reward/errors"] == 1.0
        assert metrics["reward/timeouts"] == 1.0
        assert metrics["reward/non_finite"] == 2.0
        assert metrics["reward/invalid_type"] == 1.0
        assert extras["failure"].tolist() == [
            None,
            "errors",
            "non_finite",
            "invalid_type",
            "timeouts",
            "non_finite",
            None,
        ]
        assert "acc" not in extras  # no scorer reported one
        # counters are per call: a clean batch reports zeros
        clean = make_batch(tokenizer, ["x"], ["custom"], ["?"], extra_info=[{"kind": "ok"}])
        _, metrics, _ = manager(clean)
        assert metrics["reward/errors"] == metrics["reward/timeouts"] == 0.0


def test_builtin_scorers_run_inline_unless_timeout(tokenizer):
    assert RewardManager(tokenizer)._pool is None
    with RewardManager(tokenizer, timeout_s=5.0) as manager:
        assert manager._pool is not None
        batch = make_batch(tokenizer, ["#### 3"], ["gsm8k"], ["3"])
        assert manager(batch)[0].sum() == 1.0
    with pytest.raises(ValueError, match="isolation='inline' cannot enforce timeout_s=1"):
        RewardManager(tokenizer, timeout_s=1, isolation="inline")


def test_running_normalisation_matches_hand_computation(tokenizer):
    eps = 1e-8

    def run(manager, values, **kw):
        batch = make_batch(tokenizer, ["x"] * len(values), ["c"] * len(values), values)
        return manager(batch, **kw)

    manager = RewardManager(tokenizer, _custom_from_truth, normalize=True, isolation="inline")
    scores, metrics, extras = run(manager, ["1", "3"])
    # after batch 1: mean 2, population std 1
    assert scores.sum(-1).tolist() == pytest.approx([-1.0, 1.0])
    assert extras["score"].tolist() == [1.0, 3.0]  # raw scores kept
    assert metrics["reward/score_mean"] == 2.0 and metrics["reward/shaped_score_mean"] == 0.0
    scores, metrics, _ = run(manager, ["5", "7", "9"])
    seen = np.array([1, 3, 5, 7, 9], dtype=np.float64)
    mean, std = seen.mean(), seen.std()  # 5, sqrt(8)
    expected = (np.array([5, 7, 9]) - mean) / (std + eps)
    assert scores.sum(-1).numpy() == pytest.approx(expected, rel=1e-6)
    assert metrics["reward/running_mean"] == pytest.approx(5.0)
    assert metrics["reward/running_std"] == pytest.approx(math.sqrt(8.0))

    # validation-style call: statistics stay put
    run(manager, ["100"], update_stats=False)
    assert manager.normalizer.count == 5

    # resume: a fresh manager loaded from the state dict normalises identically
    resumed = RewardManager(tokenizer, _custom_from_truth, normalize=True, isolation="inline")
    resumed.load_state_dict(manager.state_dict())
    a, _, _ = run(manager, ["2", "4"])
    b, _, _ = run(resumed, ["2", "4"])
    assert torch.equal(a, b)


def test_clipping_after_normalisation_and_raw_vs_shaped_metrics(tokenizer):
    values = ["-3", "0.5", "2", "10"]
    batch = make_batch(tokenizer, ["x"] * 4, ["c"] * 4, values)
    manager = RewardManager(
        tokenizer, _custom_from_truth, clip_range=(-1.0, 1.5), isolation="inline"
    )
    scores, metrics, extras = manager(batch)
    assert scores.sum(-1).tolist() == [-1.0, 0.5, 1.5, 1.5]
    assert extras["shaped_score"].tolist() == [-1.0, 0.5, 1.5, 1.5]
    assert metrics["reward/score_min"] == -3.0 and metrics["reward/score_max"] == 10.0
    assert metrics["reward/shaped_score_min"] == -1.0
    assert metrics["reward/shaped_score_max"] == 1.5
    assert metrics["reward/clip_ratio"] == 0.75
    with pytest.raises(ValueError, match=r"clip_range=\(1, 0\)"):
        RewardManager(tokenizer, clip_range=(1, 0))


def test_overlong_buffer_penalty(tokenizer):
    # response_len 8, buffer 4: no penalty up to 4 tokens, then -0.25 per token
    batch = make_batch(tokenizer, ["1", "1", "1", "1"], ["c"] * 4, ["1"] * 4, response_len=8)
    mask = torch.zeros(4, 8, dtype=torch.long)
    for row, length in enumerate([3, 4, 6, 8]):
        mask[row, :length] = 1
    batch.batch["response_mask"] = mask
    config = {"enable": True, "len": 4, "penalty_factor": 1.0}  # the YAML config's fields
    manager = RewardManager(
        tokenizer, _custom_from_truth, overlong_buffer=config, isolation="inline"
    )
    scores, metrics, _ = manager(batch)
    assert scores.sum(-1).tolist() == [1.0, 1.0, 0.5, 0.0]
    assert scores[3, 7] == 0.0 and scores[2, 5] == 0.5
    assert metrics["reward/overlong_ratio"] == 0.5
    assert metrics["reward/overlong_penalty_mean"] == pytest.approx(-0.375)
    assert metrics["reward/score_mean"] == 1.0
    assert OverlongBuffer.from_config({"enable": False, "len": 4}) is None
    with pytest.raises(ValueError, match="buffer_len=0"):
        OverlongBuffer(0)


def test_num_examine_logs_examples_per_data_source(tokenizer, caplog):
    batch = make_batch(
        tokenizer, ["so 1", "so 2", "so 3", "#### 4"], ["arithmetic"] * 3 + ["gsm8k"], list("1234")
    )
    with caplog.at_level(logging.INFO, logger="verl.rewards.manager"):
        RewardManager(tokenizer, num_examine=2)(batch)
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(logged) == 3  # two arithmetic examples, one gsm8k
    assert "'so 1'" in logged[0] and "[arithmetic]" in logged[0]
    assert "'#### 4'" in logged[2] and "score: 1" in logged[2]


def test_stub_tokenizer_with_only_decode():
    class StubTokenizer:
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(ord("0") + i) for i in ids if i >= 3)

    batch = DataProto.from_dict(
        tensors={
            "responses": torch.tensor([[7, 2, 0], [4, 5, 2]]),
            "response_mask": torch.tensor([[1, 1, 0], [1, 1, 1]]),
        },
        non_tensors={"data_source": ["arithmetic"] * 2, "ground_truth": ["7", "45"]},
    )
    scores, _, extras = RewardManager(StubTokenizer())(batch)
    assert scores.tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    assert extras["pred"].tolist() == ["7", "45"]


def test_registry_and_argument_validation(tokenizer):
    assert get_reward_manager("naive") is RewardManager
    with pytest.raises(ValueError, match="unknown reward_manager='dapo'"):
        get_reward_manager("dapo")
    with pytest.raises(ValueError, match="isolation='thread'"):
        RewardManager(tokenizer, isolation="thread")
    with pytest.raises(ValueError, match="timeout_s=0"):
        RewardManager(tokenizer, timeout_s=0)


def test_multi_turn_conversation_reaches_extra_info(tokenizer):
    """A batch from the agent loop (non-tensor `messages`): the reward function sees the
    prompt's messages, then the turns, in extra_info, beside the row's own extra_info."""
    seen = []

    def spy(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(extra_info)
        return 1.0

    turns = [
        {"role": "assistant", "content": "<tool_call>{}</tool_call>"},
        {"role": "tool", "name": "calculator", "content": "7"},
        {"role": "assistant", "content": "7"},
    ]
    messages = np.empty(2, dtype=object)
    messages[0], messages[1] = turns, turns[-1:]
    raw_prompt = np.empty(2, dtype=object)
    raw_prompt[0], raw_prompt[1] = [{"role": "user", "content": "3+4"}], "plain text prompt"
    batch = make_batch(
        tokenizer,
        ["7", "7"],
        ["arithmetic"] * 2,
        ["7", "7"],
        messages=messages,
        raw_prompt=raw_prompt,
        num_turns=np.array([2, 1], dtype=object),
        turn_info=np.array(
            [[{"model_tokens": 5, "tool_calls": ["calculator"], "tool_status": ["ok"]}], []],
            dtype=object,
        ),
        extra_info=np.array([{"split": "train"}, None], dtype=object),
    )
    with RewardManager(tokenizer, compute_score=spy, isolation="inline") as manager:
        manager(batch)
    assert seen[0] == {
        "split": "train",
        "messages": [{"role": "user", "content": "3+4"}, *turns],
        "num_turns": 2,
        "turn_info": [{"model_tokens": 5, "tool_calls": ["calculator"], "tool_status": ["ok"]}],
    }
    assert seen[1]["messages"] == [{"role": "user", "content": "plain text prompt"}, turns[-1]]
    assert seen[1]["num_turns"] == 1
