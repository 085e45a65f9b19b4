"""Partial rollouts on a real vLLM engine: weights posted in the middle of a streaming call;
prints one JSON line.

Run in a subprocess by ``tests/rollout/test_vllm_partial.py`` (vLLM's process-wide side
effects stay out of pytest):

    python tests/rollout/vllm_partial_check.py

A tiny Qwen2 (``VLLM_TINY_SHAPE``, weights scaled up for varied outputs), fp32. Weights A
(version 0) are in the engine; a second set B (A plus noise, version 1) is posted to the
mailbox after the call's ``SWAP_AFTER``-th engine step, so the loop takes it before the
next step. Every row runs to ``max_new_tokens`` (no stop tokens), so each row holds
``SWAP_AFTER`` tokens of A (the first one sampled by the prefill step). Each token's
vLLM log-prob is compared with an HF recomputation of the weights and cache that sampled
it:

- before the swap: A over prompt + prefix;
- ``continue`` after the swap: B over a cache written by A for the prompt and the tokens fed
  before the swap (the last token sampled by A is fed under B), as vLLM keeps it;
- ``resume`` after the swap: B over prompt + prefix from scratch (vLLM prefilled it again).

Also: the same weights pushed mid-call leave the greedy output unchanged (the running
requests keep their caches through a push); a mailbox that gets no post changes neither
samples nor log-probs (cumulative outputs instead of final-only ones) and tags version 0;
the groups handed to the sink carry their rows' versions; after a ``continue`` call the
prefix cache was reset (the next call's log-probs of the same prompts are B's from scratch).
"""

from __future__ import annotations

import copy
import json

import torch

from tests.rollout.conftest import make_batch
from verl.models.tiny import VLLM_TINY_SHAPE, build_tiny_model, build_tiny_tokenizer
from verl.protocol import DataProto
from verl.rollout import SamplingParams
from verl.rollout.partial import TOKEN_VERSIONS, WeightMailbox, load_in_place, weight_mailbox
from verl.rollout.serving import token_prompts
from verl.rollout.vllm_partial import MidCallWeights
from verl.rollout.vllm_rollout import VLLMRollout
from verl.rollout.vllm_stream import generate_streaming

QUESTIONS = ["1+2=", "what is 3*4", "hello", "the sum of 8 and 9 is"]
#: every prompt starts with this shared text (repeated to over one KV block of vLLM's CPU
#: backend, 128 tokens): vLLM's prefix cache holds its first block, so a call that reused
#: the old weights' keys / values for it would show in the log-probs
CONTEXT = "the cat has 5 apples and the dog has 3 pears. "
BLOCK = 128
SWAP_AFTER = 5  # engine steps of the call run with A
MAX_NEW = 16


def build() -> tuple[VLLMRollout, DataProto, torch.nn.Module, dict, dict]:
    tok = build_tiny_tokenizer()
    tok.padding_side = "left"
    model = build_tiny_model(tokenizer=tok, seed=0, **VLLM_TINY_SHAPE)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    model.eval()
    a = {k: v.detach().clone() for k, v in model.state_dict().items()}
    b = {
        k: v + torch.randn(v.shape, generator=gen) * 0.05 if v.is_floating_point() else v.clone()
        for k, v in a.items()
    }
    rollout = VLLMRollout(model, tok, pad_token_id=tok.pad_token_id, max_model_len=320, seed=0)
    context = CONTEXT
    while len(tok(context)["input_ids"]) < BLOCK + 8:
        context += CONTEXT
    return rollout, make_batch(tok, [context + q for q in QUESTIONS]), model, a, b


def set_engine(rollout: VLLMRollout, state: dict) -> None:
    load_in_place(rollout.module, state)
    rollout.update_weights(rollout.module.state_dict().items())


def run(rollout, prompts, params, mode, post, seed):
    """A streaming call under a mailbox (``mode``, held 0) that gets ``post`` (a state
    dict, version 1) after step ``SWAP_AFTER``; the output, the groups, the mailbox."""
    engine = rollout.llm.llm_engine
    box = WeightMailbox(mode)
    box.held = 0
    step, steps = engine.step, [0]

    def counted():
        out = step()
        steps[0] += 1
        if steps[0] == SWAP_AFTER and post is not None:
            box.post({k: v.clone() for k, v in post.items()}, 1)
        return out

    engine.step = counted
    groups = {}
    torch.manual_seed(seed)
    try:
        with weight_mailbox(box):
            out = generate_streaming(
                rollout, prompts, params, lambda i, g, p: groups.__setitem__(i, g)
            )
    finally:
        engine.step = step
    return out, groups, box


def scorer(state: dict, model: torch.nn.Module) -> torch.nn.Module:
    other = copy.deepcopy(model)
    other.load_state_dict(state)
    return other.eval()


@torch.no_grad()
def recomputed(out, prompts, n, a_model, b_model, mode):
    """Per row: |vLLM - recomputation| of the tokens before and after the swap, and the
    after-swap gap to B from scratch (what a continue row is NOT)."""
    ids_in = token_prompts(prompts.batch["input_ids"], prompts.batch["attention_mask"])
    before, after, b_scratch = [], [], []
    for row in range(len(out)):
        prompt = torch.tensor(ids_in[row // n])
        length = int(out.batch["response_mask"][row].sum())
        gen = out.batch["responses"][row, :length]
        got = out.batch["rollout_log_probs"][row, :length]
        s = int((out.batch[TOKEN_VERSIONS][row, :length] == 0).sum())
        full = torch.cat([prompt, gen]).unsqueeze(0)
        plen = len(prompt)

        def logp(model, ids, start):
            logits = model(ids).logits[0, start - 1 : -1].float()
            return torch.log_softmax(logits, -1).gather(-1, ids[0, start:, None])[:, 0]

        lp_a = logp(a_model, full, plen)
        before.append(float((lp_a[:s] - got[:s]).abs().max()))
        lp_b = logp(b_model, full, plen)
        b_scratch.append(float((lp_b[s:] - got[s:]).abs().max()) if s < length else 0.0)
        if s == length:
            continue
        if mode == "resume":
            want = lp_b[s:]
        else:  # A wrote the cache of prompt + gen[: s - 1]; B feeds gen[s - 1 :]
            cache = a_model(full[:, : plen + s - 1], use_cache=True).past_key_values
            logits = b_model(full[:, plen + s - 1 : -1], past_key_values=cache).logits[0]
            want = torch.log_softmax(logits.float(), -1).gather(-1, gen[s:, None])[:, 0]
        after.append(float((want - got[s:]).abs().max()))
    return before, after, b_scratch


@torch.no_grad()
def gap_to(out, prompts, model) -> float:
    """max |vLLM log-prob - ``model``'s from scratch| over ``out``'s tokens (n=2)."""
    ids_in = token_prompts(prompts.batch["input_ids"], prompts.batch["attention_mask"])
    gaps = []
    for row in range(len(out)):
        prompt = torch.tensor(ids_in[row // 2])
        gen = out.batch["responses"][row]
        logits = model(torch.cat([prompt, gen]).unsqueeze(0)).logits[0, len(prompt) - 1 : -1]
        lp = torch.log_softmax(logits, -1).gather(-1, gen[:, None])[:, 0]
        gaps.append(float((lp - out.batch["rollout_log_probs"][row]).abs().max()))
    return max(gaps)


def rows_versions(out):
    v = out.batch[TOKEN_VERSIONS]
    return [sorted(set(r[r >= 0].tolist())) for r in v]


def counts(out):
    v = out.batch[TOKEN_VERSIONS]
    return [int((r == 0).sum()) for r in v], [int((r == 1).sum()) for r in v]


def main() -> None:
    rollout, prompts, model, a, b = build()
    a_model, b_model = scorer(a, model), scorer(b, model)
    config = rollout.llm.llm_engine.vllm_config
    result = {
        "async_scheduling": bool(config.scheduler_config.async_scheduling),
        "block_size": config.cache_config.block_size,
        "prefix_caching": bool(config.cache_config.enable_prefix_caching),
        "prompt_lengths": prompts.batch["attention_mask"].sum(1).tolist(),
    }
    greedy = SamplingParams(do_sample=False, max_new_tokens=MAX_NEW, stop_token_ids=[])
    sampled = SamplingParams(n=2, max_new_tokens=MAX_NEW, stop_token_ids=[])

    # no post: the samples and log-probs of the call without a mailbox, version 0 everywhere
    torch.manual_seed(5)
    plain = generate_streaming(rollout, prompts, sampled, None)
    quiet, _, box = run(rollout, prompts, sampled, "continue", None, 5)
    result["no_post_same"] = all(torch.equal(plain.batch[k], quiet.batch[k]) for k in plain.batch)
    result["no_post_versions"] = sorted({v for r in rows_versions(quiet) for v in r})
    result["no_post_swaps"] = box.stats["swaps"]

    # the same weights pushed mid-call: the greedy output does not change
    plain_greedy = generate_streaming(rollout, prompts, greedy, None)
    for mode in ("continue", "resume"):
        same, _, box = run(rollout, prompts, greedy, mode, a, 0)
        result[f"{mode}_same_weights_equal"] = torch.equal(
            same.batch["responses"], plain_greedy.batch["responses"]
        )
        result[f"{mode}_same_weights_logprob_gap"] = float(
            (same.batch["rollout_log_probs"] - plain_greedy.batch["rollout_log_probs"]).abs().max()
        )
        result[f"{mode}_same_weights_swaps"] = box.stats["swaps"]
        set_engine(rollout, a)

    # B posted mid-call
    for mode in ("continue", "resume"):
        out, groups, box = run(rollout, prompts, sampled, mode, b, 7)
        old, new = counts(out)
        before, after, b_scratch = recomputed(out, prompts, 2, a_model, b_model, mode)
        joined = DataProto.concat([groups[i] for i in range(len(QUESTIONS))])
        result[mode] = {
            "swaps": box.stats["swaps"],
            "held": box.held,
            "resumed_rows": box.stats["resumed_rows"],
            "reprefill_tokens": box.stats["reprefill_tokens"],
            "old_tokens": old,
            "new_tokens": new,
            "lengths": out.batch["response_mask"].sum(1).tolist(),
            "before_gap": max(before),
            "after_gap": max(after),
            "after_gap_to_b_from_scratch": max(b_scratch),
            "groups_equal_output": all(
                torch.equal(joined.batch[k], out.batch[k]) for k in out.batch
            ),
            "prefix_cache_stale": rollout.prefix_cache_stale,
        }
        if mode == "continue":
            # the engine holds B; the same prompts again: no prompt block of A reused
            again = generate_streaming(rollout, prompts, sampled, None)
            result[mode]["next_call_gap_to_b"] = gap_to(again, prompts, b_model)
            # control: without the deferred reset the next call does reuse A's block
            set_engine(rollout, a)
            close, MidCallWeights.close = MidCallWeights.close, lambda self: None
            try:
                run(rollout, prompts, sampled, mode, b, 7)
            finally:
                MidCallWeights.close = close
            again = generate_streaming(rollout, prompts, sampled, None)
            result[mode]["next_call_gap_to_b_without_reset"] = gap_to(again, prompts, b_model)
        set_engine(rollout, a)
    print(json.dumps(result))
    rollout.close()


if __name__ == "__main__":
    main()
