"""Partial rollouts in the native engine (``verl/rollout/partial.py``, the mailbox polled by
``verl/rollout/continuous.py``): a swap scripted to land mid-sequence, each token's
recorded version, its log-prob against a no-cache recomputation with the weights of that
version, and a mailbox with nothing posted changing nothing."""

from __future__ import annotations

import copy

import pytest
import torch

from verl.algorithms.rollout_correction import compute_rollout_is_weights
from verl.rollout import SamplingParams
from verl.rollout.native import NativeRollout
from verl.rollout.partial import (
    TOKEN_VERSIONS,
    WeightMailbox,
    oldest_token_version,
    weight_mailbox,
)

from .conftest import make_batch

TEXTS = ["1+2=", "what is the sum of 3 and", "hello", "the cat has 5 apples", "a b c"]
PARAMS = SamplingParams(n=2, max_new_tokens=14, seed=5, temperature=1.0, stop_token_ids=[])
SWAP_AT = 5  # the scripted trainer posts v1 when a row samples its 6th token
SLOTS = 4  # 10 rows through 4 slots: rows in flight at the swap, rows admitted after it


def _new_weights(model) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(9)
    return {
        k: v + 0.2 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v.clone()
        for k, v in model.state_dict().items()
    }


def _run(model, tokenizer, mode: str | None, post: bool = True):
    module = copy.deepcopy(model)
    v1 = _new_weights(model)
    mailbox = WeightMailbox(mode or "continue")
    mailbox.held = 0

    def scripted_trainer(logits, rows, steps):
        if post and mailbox.posted_version is None and int(steps.max()) >= SWAP_AT:
            mailbox.post(v1, 1)
        return logits

    engine = NativeRollout(module, tokenizer, max_num_seqs=SLOTS, logits_processor=scripted_trainer)
    batch = make_batch(tokenizer, TEXTS)
    if mode is None:
        return engine.generate(batch, PARAMS), engine, batch, v1
    with weight_mailbox(mailbox):
        out = engine.generate(batch, PARAMS)
    return out, engine, batch, v1


def _recomputed(model, batch, out, n: int) -> torch.Tensor:
    """(rows, R) log-probs of each response token by a no-cache forward of prompt + response
    with ``model`` (the prompt's real tokens only, positions from 0)."""
    rows = []
    for r in range(len(out)):
        prompt = batch.batch["input_ids"][r // n][batch.batch["attention_mask"][r // n].bool()]
        resp = out.batch["responses"][r]
        ids = torch.cat([prompt, resp]).unsqueeze(0)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
        lp = logits[len(prompt) - 1 : -1].log_softmax(-1)
        rows.append(lp.gather(-1, resp.unsqueeze(-1)).squeeze(-1))
    return torch.stack(rows)


@pytest.mark.parametrize("mode", ["continue", "resume"])
def test_versions_are_recorded_across_a_mid_sequence_swap(model, tokenizer, mode):
    out, engine, _, _ = _run(model, tokenizer, mode)
    versions = out.batch[TOKEN_VERSIONS]
    mask = out.batch["response_mask"].bool()
    assert engine.last_stats["weight_swaps"] == 1.0
    assert set(versions[mask].tolist()) == {0, 1} and (versions[~mask] == -1).all()
    # each row: its tokens before the swap are v0, after it v1 (never back)
    assert (versions[:, 1:] >= versions[:, :-1]).all()
    spans = [
        r for r in range(len(out)) if 0 < int((versions[r] == 0).sum()) < PARAMS.max_new_tokens
    ]
    assert spans, "the swap must land in the middle of some sequences"
    assert all(int((versions[r] == 0).sum()) >= SWAP_AT for r in spans)
    assert any(bool((versions[r] == 1).all()) for r in range(len(out)))  # admitted after it
    assert oldest_token_version(out, default=7) == 0
    if mode == "resume":
        assert engine.last_stats["reprefill_rows"] >= len(spans)
        assert engine.last_stats["reprefill_tokens"] > 0
    else:
        assert "reprefill_rows" in engine.last_stats and engine.last_stats["reprefill_rows"] == 0


@pytest.mark.parametrize("mode", ["continue", "resume"])
def test_behaviour_log_probs_are_those_of_each_tokens_version(model, tokenizer, mode):
    """resume: every token's log-prob equals a recomputation with the weights of its
    version (within the engine's 1e-4, fp32). continue: the tokens sampled before the swap
    and those of rows admitted after it do; a token decoded after the swap over the cache
    the old weights wrote does not equal pi_v1(token | prefix) (what continue costs)."""
    out, _, batch, v1 = _run(model, tokenizer, mode)
    new = copy.deepcopy(model)
    new.load_state_dict(v1)
    by_version = {
        0: _recomputed(model, batch, out, PARAMS.n),
        1: _recomputed(new, batch, out, PARAMS.n),
    }
    versions = out.batch[TOKEN_VERSIONS]
    mask = out.batch["response_mask"].bool()
    want = torch.where(versions == 0, by_version[0], by_version[1])
    diff = (out.batch["rollout_log_probs"] - want).abs().masked_fill(~mask, 0.0)
    if mode == "resume":
        assert float(diff.max()) < 1e-4
        return
    spans = (versions == 0).any(-1) & (versions == 1).any(-1)
    exact = (versions == 0) | ~spans.unsqueeze(-1)
    assert float(diff[exact].max()) < 1e-4
    assert float(diff[~exact & mask].max()) > 1e-3  # stale keys / values after the swap


def test_a_mailbox_with_nothing_posted_changes_nothing(model, tokenizer):
    plain, _, _, _ = _run(model, tokenizer, None, post=False)
    tagged, engine, _, _ = _run(model, tokenizer, "resume", post=False)
    assert TOKEN_VERSIONS not in plain.batch and engine.last_stats["weight_swaps"] == 0
    for key in ("responses", "response_mask", "rollout_log_probs"):
        assert torch.equal(plain.batch[key], tagged.batch[key]), key
    mask = tagged.batch["response_mask"].bool()
    assert (tagged.batch[TOKEN_VERSIONS][mask] == 0).all()


def test_truncated_is_weights_of_mixed_versions_by_hand():
    """Per token, the truncated IS weight min(exp(old - rollout), C) uses the log-prob of
    the version that sampled that token: the versions themselves do not enter it."""
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, 0.0]])
    # row 0: tokens of v3, v3, v4; row 1: v4, v4 and padding
    rollout = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, -4.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    weights, metrics = compute_rollout_is_weights(old, rollout, mask, threshold=2.0)
    e = torch.tensor(1.0).exp().item()
    by_hand = [
        [min(torch.tensor(0.5).exp().item(), 2.0), min(1 / e, 2.0), 1.0],
        [min(torch.tensor(-0.1).exp().item(), 2.0), 2.0, 0.0],  # exp(1) = 2.718 -> 2.0
    ]
    assert torch.allclose(weights, torch.tensor(by_hand), atol=1e-6)
    assert float(metrics["rollout_is_clipfrac"]) == pytest.approx(1 / 5)


def test_mailbox_post_take_and_reset():
    box = WeightMailbox("continue")
    box.held = 2
    box.post({"w": torch.zeros(1)}, 2)
    assert box.take() is None  # not newer than held
    box.post({"w": torch.ones(1)}, 4)
    box.post({"w": torch.full((1,), 3.0)}, 3)  # older than the post waiting: ignored
    state, version = box.take()
    assert version == 4 and float(state["w"]) == 1.0 and box.take() is None
    box.reset()
    assert box.posted_version is None and box.held is None
    with pytest.raises(ValueError, match="partial_rollout='off'"):
        WeightMailbox("off")
    module = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match="missing"):
        box.held = 0
        box.post({"weight": torch.zeros(1, 2)}, 1)
        box.poll(module)
