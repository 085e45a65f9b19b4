"""Partial rollouts under bf16 autocast: a mid-call swap must reach the weights autocast
computes with, not only the fp32 parameters.

The generate call runs inside the worker's ``engine.autocast()``
(:func:`verl.workers.actor_rollout.run_generation`, the call stack of the streaming copy);
autocast caches each parameter's bf16 cast until its outermost region exits, and the
mailbox's swap (:meth:`verl.rollout.partial.WeightMailbox.poll`) lands inside that region.
Without ``torch.clear_autocast_cache()`` after the in-place copy
(:func:`verl.rollout.partial.load_in_place`) every Linear after the swap would compute
with the old weights' casts while its tokens are tagged with the new version: measured on
this model, the post-swap log-probs were then up to 14 nats from a fresh bf16 forward of
the new weights, against 0.12 with the clear (the bf16 rounding of these large weights).
"""

from __future__ import annotations

import copy
from contextlib import nullcontext

import pytest
import torch

from verl.engine.single import SingleProcessEngine
from verl.rollout import SamplingParams
from verl.rollout.native import NativeRollout
from verl.rollout.partial import TOKEN_VERSIONS, WeightMailbox, weight_mailbox
from verl.workers.actor_rollout import run_generation

from .conftest import make_batch

TEXTS = ["1+2=", "what is the sum of 3 and", "hello", "the cat has 5 apples", "a b c"]
PARAMS = SamplingParams(n=2, max_new_tokens=14, seed=5, temperature=1.0, stop_token_ids=[])
SWAP_AT = 5  # the scripted trainer posts v1 when a row samples its 6th token
SLOTS = 4  # 10 rows through 4 slots: rows in flight at the swap, rows admitted after it
# bf16 against a fresh bf16 forward of prompt + response: the same weights, two bf16
# computations (decode over a bf16-rounded cache vs one forward). On this model's large
# weights (std 0.25, + 0.2 for v1) measured mean 2.1e-2, max 0.08-0.12 (docs/rollout.md,
# "Precision": two bf16 computations of one quantity); stale casts: mean ~5 nats.
BF16_MEAN, BF16_MAX = 5e-2, 0.3
FP32_MAX = 1e-4  # the engine's fp32 bound (test_partial_rollout.py)
STALE_MEAN = 1.0  # the old weights' log-probs are further than this from the new ones'


def _new_weights(model) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(9)
    return {
        k: v + 0.2 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v.clone()
        for k, v in model.state_dict().items()
    }


def _generate(model, tokenizer, mode: str, autocast: torch.dtype | None, cache: bool = True):
    """One call through the worker's generation path with a swap to v1 after SWAP_AT
    tokens. ``autocast``: the engine's autocast dtype (None: fp32); ``cache=False``: the
    reference, autocast casting every weight at every use (nothing cached to go stale)."""
    module = copy.deepcopy(model)
    assert all(p.requires_grad for p in module.parameters())  # what autocast caches
    v1 = _new_weights(model)
    mailbox = WeightMailbox(mode)
    mailbox.held = 0

    def scripted_trainer(logits, rows, steps):
        if mailbox.posted_version is None and int(steps.max()) >= SWAP_AT:
            mailbox.post(v1, 1)
        return logits

    engine = SingleProcessEngine(module, None, autocast_dtype=autocast)
    if not cache:
        engine.autocast = lambda cache_enabled=True: torch.autocast(
            "cpu", dtype=autocast, cache_enabled=False
        )
    rollout = NativeRollout(
        engine.module, tokenizer, max_num_seqs=SLOTS, logits_processor=scripted_trainer
    )
    batch = make_batch(tokenizer, TEXTS)
    with weight_mailbox(mailbox):
        out = run_generation(
            engine, rollout, rollout.generate, batch, PARAMS, torch.device("cpu"), None
        )
    assert rollout.last_stats["weight_swaps"] == 1.0
    return out, batch, v1


def _recomputed(model, batch, out, autocast: torch.dtype | None) -> torch.Tensor:
    """(rows, R) log-probs of each response token by a fresh no-cache forward of prompt +
    response with ``model``, under autocast to ``autocast`` (None: fp32)."""
    rows = []
    for r in range(len(out)):
        real = batch.batch["attention_mask"][r // PARAMS.n].bool()
        prompt = batch.batch["input_ids"][r // PARAMS.n][real]
        resp = out.batch["responses"][r]
        ids = torch.cat([prompt, resp]).unsqueeze(0)
        with (
            torch.no_grad(),
            torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None),
        ):
            logits = model(input_ids=ids).logits[0].float()
        lp = logits[len(prompt) - 1 : -1].log_softmax(-1)
        rows.append(lp.gather(-1, resp.unsqueeze(-1)).squeeze(-1))
    return torch.stack(rows)


def _new_policy_tokens(out, mode: str) -> torch.Tensor:
    """(rows, R) bool: tokens drawn from exactly pi_v1(. | prefix): every v1 token in
    resume mode; in continue mode those of rows admitted after the swap (the rows in flight
    decode over keys / values the old weights wrote)."""
    versions = out.batch[TOKEN_VERSIONS]
    new = (versions == 1) & out.batch["response_mask"].bool()
    if mode == "continue":
        new &= (versions == 1).all(-1, keepdim=True)
    assert int(new.sum()) >= 20, "the swap must leave tokens sampled by the new weights"
    return new


def _gaps(model, tokenizer, mode: str, autocast: torch.dtype | None):
    """The call's output and its post-swap tokens' |log-prob - fresh forward| against the
    new weights and against the old ones."""
    out, batch, v1 = _generate(model, tokenizer, mode, autocast)
    new_model = copy.deepcopy(model)
    new_model.load_state_dict(v1)
    tokens = _new_policy_tokens(out, mode)
    got = out.batch["rollout_log_probs"]
    to_new = (got - _recomputed(new_model, batch, out, autocast)).abs()[tokens]
    to_old = (got - _recomputed(model, batch, out, autocast)).abs()[tokens]
    return out, to_new, to_old


@pytest.mark.parametrize("mode", ["continue", "resume"])
def test_bf16_tokens_after_a_swap_are_those_of_the_new_weights(model, tokenizer, mode):
    _, to_new, to_old = _gaps(model, tokenizer, mode, torch.bfloat16)
    assert float(to_new.mean()) < BF16_MEAN and float(to_new.max()) < BF16_MAX
    assert float(to_old.mean()) > STALE_MEAN  # control: the versions are far apart


@pytest.mark.parametrize("mode", ["continue", "resume"])
def test_bf16_swap_equals_autocast_without_a_cast_cache(model, tokenizer, mode):
    """Every token, the in-flight rows' mixed-cache ones included: bit for bit the call
    whose autocast caches nothing (each use casts the weights it finds)."""
    cached, _, _ = _generate(model, tokenizer, mode, torch.bfloat16)
    uncached, _, _ = _generate(model, tokenizer, mode, torch.bfloat16, cache=False)
    for key in ("responses", "rollout_log_probs", TOKEN_VERSIONS):
        assert torch.equal(cached.batch[key], uncached.batch[key]), key


def test_bf16_stale_casts_are_caught_without_the_clear(model, tokenizer, monkeypatch):
    """The control: with the cache left alone after the swap the post-swap tokens'
    log-probs are far from the new weights' (the test above would fail)."""
    monkeypatch.setattr(torch, "clear_autocast_cache", lambda: None)
    _, to_new, _ = _gaps(model, tokenizer, "resume", torch.bfloat16)
    assert float(to_new.mean()) > STALE_MEAN


@pytest.mark.parametrize("mode", ["continue", "resume"])
def test_fp32_tokens_after_a_swap_are_those_of_the_new_weights(model, tokenizer, mode):
    _, to_new, to_old = _gaps(model, tokenizer, mode, None)
    assert float(to_new.max()) < FP32_MAX
    assert float(to_old.mean()) > STALE_MEAN


@pytest.mark.parametrize(
    ("pack_weights", "outer_region"), [(True, False), (False, False), (False, True)]
)
def test_bf16_weights_loaded_between_calls_reach_the_next_call(
    model, tokenizer, pack_weights, outer_region
):
    """The one-step-off / partial_rollout=off copy: weights copied in place between two
    calls (as ``RolloutCopyWorker.load_policy_weights`` does, with no cache clear of its
    own) reach the next call: its autocast region starts with an empty cache, and the
    packed Linears (``pack_weights``, the default without a mailbox) repack a weight whose
    version counter moved. The control: an autocast region held open around both calls
    (nothing in verl does) keeps the first call's casts, and the second call samples with
    the old weights."""
    module = copy.deepcopy(model)
    v1 = _new_weights(model)
    engine = SingleProcessEngine(module, None, autocast_dtype=torch.bfloat16)
    rollout = NativeRollout(engine.module, tokenizer, pack_weights=pack_weights)
    batch = make_batch(tokenizer, TEXTS)

    def call():
        return run_generation(
            engine, rollout, rollout.generate, batch, PARAMS, torch.device("cpu"), None
        )

    # not torch.autocast(enabled=False): a disabled region counts in the nesting too, and
    # the cache is dropped only when the outermost region exits
    outer = torch.autocast("cpu", dtype=torch.bfloat16) if outer_region else nullcontext()
    with outer:
        call()  # fills (and, as the outermost region, on exit drops) the cache: v0's casts
        targets = engine.module.state_dict()
        for name, tensor in v1.items():
            targets[name].copy_(tensor)
        out = call()
    new_model = copy.deepcopy(model)
    new_model.load_state_dict(v1)
    mask = out.batch["response_mask"].bool()
    got = out.batch["rollout_log_probs"]
    to_new = (got - _recomputed(new_model, batch, out, torch.bfloat16)).abs()[mask]
    to_old = (got - _recomputed(model, batch, out, torch.bfloat16)).abs()[mask]
    if outer_region:
        assert float(to_new.mean()) > STALE_MEAN
        return
    assert float(to_new.mean()) < BF16_MEAN and float(to_new.max()) < BF16_MAX
    assert float(to_old.mean()) > STALE_MEAN
