"""Partial rollouts with the rollout copy in a Ray actor (``trainer.backend=ray``,
``trainer.partial_rollout``; ``verl/trainer/rl/ray_copy_link.py``).

The copy owns a weight mailbox in its own process; the driver posts each step's weights into
it beside the running call, and the native continuous loop swaps them in between two decode
steps there. Through ``fit`` (slow, Ray, 3 streaming GRPO steps on the tiny model): the
copy's second call waits at its third sampling step for the step-2 post, so the swap lands
mid-call; the trained rows hold tokens of versions 0 and 1, and each token's recorded
log-prob equals a no-cache recomputation under the weights of its recorded version
(``resume``: every token; ``continue``: the tokens sampled before their call's first swap,
the later ones decode over the old weights' cache by design). A control whose copy keeps
its old weights while its versions advance fails that comparison. Against a fake copy in
another process (fast): the posts go to the copy, not the driver's mailbox, once per version
and never older; a call carries the mailbox's mode and returns the version it started with;
a checkpoint load resets the copy's mailbox. A run resumed from the ``resume``-mode run's
step-2 checkpoint, saved after a mid-call swap (slow), posts its step's version once into
the fresh copy and trains on versions 1-2.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import defaultdict

import pytest
import torch

from verl.controller import Dispatch, register
from verl.kernels.torch_functional import compute_response_log_probs
from verl.protocol import DataProto
from verl.rollout.partial import TOKEN_VERSIONS, WeightMailbox
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl.async_rollout import AsyncRollout
from verl.trainer.rl.trainer import RLTrainer
from verl.workers.rollout_copy import WEIGHT_MAILBOX, RolloutCopyWorker

from .taken_batches import assert_token_versions, fit_recording_batches

WAIT_FOR_POST_S = 60.0  # the second call's wait for the step-2 post (it comes in ~1-5 s)
LOGPROB_BOUND = 1e-4  # fp32 recorded vs recomputed, per token


class WaitingCopy(RolloutCopyWorker):
    """The rollout copy whose second generation call, at its third sampling step, waits
    (at most :data:`WAIT_FOR_POST_S`) until a version newer than the one its module holds
    was posted: the loop's next poll swaps it in mid-call. The samples do not change."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        super().init_model(total_steps)
        plain = self.rollout._sample
        seeds: list[int] = []  # each call's sampling seed, in call order
        steps_of: dict[int, int] = defaultdict(int)

        def waiting(logits, rows, steps, params, seed):
            if params.seed not in seeds:
                seeds.append(params.seed)
            steps_of[params.seed] += 1
            box = self.weight_box
            if seeds.index(params.seed) == 1 and steps_of[params.seed] == 3 and box is not None:
                deadline = time.monotonic() + WAIT_FOR_POST_S
                while box.posted_version <= box.held and time.monotonic() < deadline:
                    time.sleep(0.02)
            return plain(logits, rows, steps, params, seed)

        self.rollout._sample = waiting


class UndeliveredCopy(WaitingCopy):
    """The control: each post carries the weights the copy's module holds instead of the
    posted ones (the versions advance, the weights never arrive)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, rank_zero_result=True, beside=True)
    def post_policy_weights(self, state, version, mode):
        own = {k: v.detach().clone() for k, v in self.engine.module.state_dict().items()}
        return super().post_policy_weights(own, version, mode)


def _partial_run(rl_config, monkeypatch, copy_cls, mode, *extra):
    """A 3-step streaming GRPO run on Ray with ``copy_cls`` as the rollout copy (``extra``:
    more overrides): the trained batches, the weights posted per version (as the driver
    sent them), the metrics."""
    import verl.workers.rollout_copy as rollout_copy

    monkeypatch.setattr(rollout_copy, "RolloutCopyWorker", copy_cls)
    config = rl_config(
        "actor_rollout_ref.rollout.seed=11",
        # 3 slots < 4 prompts x 2 samples: rows start and finish mid-call
        "actor_rollout_ref.rollout.decode_slots=3",
        "trainer.backend=ray",
        "trainer.async_rollout=true",
        "trainer.rollout_mode=streaming",
        "trainer.max_staleness=1",
        f"trainer.partial_rollout={mode}",
        "actor_rollout_ref.actor.rollout_is_threshold=2.0",
        # the random model's reward is 0 everywhere: the entropy bonus makes updates move
        "actor_rollout_ref.actor.entropy_coeff=0.05",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "trainer.val_before_train=false",
        "trainer.total_training_steps=3",  # step 3 trains a call started with version 1
        *extra,
    )
    trainer = RLTrainer(config, tracker=Tracker([]))
    group = trainer.async_rollout.group
    assert type(group).__name__ == "RayWorkerGroup"
    posted: dict[int, dict[str, torch.Tensor]] = {}
    plain_post = group.post_policy_weights

    def recording_post(state, version, box_mode):
        posted[version] = {k: v.clone() for k, v in state.items()}
        return plain_post(state, version, box_mode)

    group.post_policy_weights = recording_post
    taken = fit_recording_batches(trainer)
    assert not [t for t in threading.enumerate() if t.name.startswith("verl-rollout")]
    return taken, posted, trainer.history


def _gaps(taken, posted, model_dir, mode):
    """Per version: the largest |recorded - recomputed| log-prob over the tokens the mode
    makes exact (``resume``: all; ``continue``: those of their call's first version)."""
    from transformers import AutoModelForCausalLM

    module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    call_start: dict[str, int] = {}  # batch index -> the version its call started with
    for gen in taken:
        versions = gen.batch[TOKEN_VERSIONS]
        for row, uid in enumerate(gen.non_tensor_batch["uid"]):
            call = uid.split("-")[0]
            valid = versions[row][versions[row] >= 0]
            if valid.numel():
                call_start[call] = min(call_start.get(call, 10**9), int(valid.min()))
    gaps: dict[int, float] = {}
    for version, state in sorted(posted.items()):
        module.load_state_dict(state)
        for gen in taken:
            b = gen.batch
            with torch.no_grad():
                (lp, *_) = compute_response_log_probs(
                    module,
                    b["input_ids"],
                    b["attention_mask"],
                    b["position_ids"],
                    response_len=b["responses"].shape[1],
                    temperature=float(gen.meta_info.get("temperature", 1.0)),
                )
            mine = b[TOKEN_VERSIONS] == version
            if mode == "continue":
                starts = torch.tensor(
                    [call_start[u.split("-")[0]] for u in gen.non_tensor_batch["uid"]]
                )
                mine &= (starts == version)[:, None]
            if bool(mine.any()):
                gap = float((lp.float() - b["rollout_log_probs"].float()).abs()[mine].max())
                gaps[version] = max(gaps.get(version, 0.0), gap)
    return gaps


def _straddling_rows(taken) -> int:
    count = 0
    for gen in taken:
        versions = gen.batch[TOKEN_VERSIONS]
        for row in versions:
            count += len(set(row[row >= 0].tolist())) > 1
    return count


@pytest.fixture(scope="module")
def resume_mode_run(module_rl_config, ray_session, tmp_path_factory):
    """The ``resume``-mode run of :func:`_partial_run` with the waiting copy, saved after
    step 2 (and 3), made once: the swap test reads it and the resume test resumes from its
    step-2 checkpoint. Returns the run's trained batches, posts and metrics, and its
    directory."""
    run_dir = tmp_path_factory.mktemp("resume_mode_run") / "run"
    saving = ("trainer.save_freq=2", f"trainer.default_local_dir={run_dir}")
    with pytest.MonkeyPatch.context() as mp:
        return (*_partial_run(module_rl_config, mp, WaitingCopy, "resume", *saving), run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["continue", "resume"])
def test_weights_swap_mid_call_in_the_ray_copy(rl_config, ray_session, monkeypatch, mode, request):
    if mode == "resume":  # the run the resume test starts from
        taken, posted, history, _ = request.getfixturevalue("resume_mode_run")
    else:
        taken, posted, history = _partial_run(rl_config, monkeypatch, WaitingCopy, mode)
    assert len(taken) == 3 and sorted(posted) == [0, 1, 2]  # one post per step
    for step, gen in enumerate(taken):
        assert_token_versions(gen, step)
    # the step-2 post reached the copy's second call between two decode steps
    assert history[1]["stream/midcall_weight_swaps_total"] >= 1
    assert _straddling_rows(taken) >= 1
    assert {0, 1} <= set(taken[1].batch[TOKEN_VERSIONS].flatten().tolist())
    gaps = _gaps(taken, posted, rl_config().actor_rollout_ref.model.path, mode)
    if mode == "resume":  # every token is checked, the v1 tokens of the straddling rows too
        assert {0, 1} <= set(gaps), gaps
    else:  # the tokens of each call's first version: v0 and a later call's (v1 or v2: timing)
        assert 0 in gaps and len(gaps) >= 2, gaps
    assert max(gaps.values()) < LOGPROB_BOUND, gaps


@pytest.mark.slow
def test_an_undelivered_post_fails_the_log_prob_check(rl_config, ray_session, monkeypatch):
    taken, posted, _ = _partial_run(rl_config, monkeypatch, UndeliveredCopy, "resume")
    assert _straddling_rows(taken) >= 1  # the versions advanced mid-call
    gaps = _gaps(taken, posted, rl_config().actor_rollout_ref.model.path, "resume")
    assert gaps[0] < LOGPROB_BOUND  # the weights it does hold: exact
    assert gaps[1] > 100 * LOGPROB_BOUND, gaps  # tokens tagged v1, sampled with v0


class _RemoteCopy:
    """A copy group in another process, as the pipeline sees it: posts, resets and calls
    are recorded; a call reports it started with the newest post and swapped once."""

    def __init__(self) -> None:
        self.posts: list[tuple[int, str]] = []
        self.resets = 0
        self.calls: list[dict] = []

    def take_streamed_groups(self, token):
        return []

    def weight_mailbox_state(self):
        return None

    def post_policy_weights(self, state, version, mode):
        assert state == {"w": version}
        self.posts.append((version, mode))
        return version

    def reset_weight_mailbox(self):
        self.resets += 1

    def load_policy_weights(self, state, version):
        raise AssertionError("a remote mailbox is loaded by the copy itself")

    def generate(self, _group, prompts: DataProto) -> DataProto:
        self.calls.append(dict(prompts.meta_info[WEIGHT_MAILBOX]))
        start = self.posts[-1][0]
        out = DataProto.from_dict({"x": prompts.batch["x"]})
        out.meta_info[WEIGHT_MAILBOX] = {
            "start": start,
            "held": start + 1,
            "load_s": 0.25,
            "stats": {"swaps": 1.0, "load_s": 0.5},
        }
        return out


def test_posts_reach_the_copy_in_another_process_and_calls_report_their_version(monkeypatch):
    monkeypatch.setattr(AsyncRollout, "_copy_in_other_process", lambda self: True)
    fake = _RemoteCopy()
    actor = {"version": 0}
    pipe = AsyncRollout(
        fake,
        fake.generate,
        lambda: {"w": actor["version"]},
        max_staleness=1,
        seed=0,
        mailbox=WeightMailbox("continue"),
    )
    try:
        actor["version"] = 2
        pipe.post_weights(2)
        pipe.post_weights(2)  # posted already: not sent again
        pipe.post_weights(1)  # older: never sent
        assert fake.posts == [(2, "continue")]
        assert pipe.mailbox.posted_version == 2 and pipe.mailbox.take() is None  # no weights kept
        pipe.fill(lambda: DataProto.from_dict({"x": torch.tensor([1, 2])}), 1, limit=1)
        gen, version, metrics = pipe.pop_any()
        assert fake.calls == [{"mode": "continue", "version": 1}]
        assert version == 2  # the version the copy started the call with
        assert metrics["timing_s/async_weight_sync"] == 0.25
        assert WEIGHT_MAILBOX not in gen.meta_info
        assert pipe.mailbox.held == 3 and pipe.mailbox.stats["swaps"] == 1.0
        pipe.load_state_dict({"launched": 1, "inflight": []})
        assert fake.resets == 1 and pipe.mailbox.posted_version is None
    finally:
        pipe.close()


@pytest.mark.parametrize("mode", ["continue", "resume"])
def test_config_takes_partial_rollouts_on_the_ray_backend(rl_config, mode):
    cfg = rl_config(
        "trainer.backend=ray",
        "trainer.async_rollout=true",
        "trainer.rollout_mode=streaming",
        f"trainer.partial_rollout={mode}",
    )
    assert cfg.trainer.partial_rollout == mode and cfg.worker_backend == "ray"


@pytest.mark.slow
def test_a_resumed_ray_run_posts_again_into_a_fresh_copy(
    rl_config, ray_session, monkeypatch, tmp_path, resume_mode_run
):
    """Resumed from the step-2 checkpoint of the ``resume``-mode run (a swap made mid-call):
    the new copy's mailbox starts empty, the resumed step posts its version once and trains
    on groups of versions 1-2."""
    _, _, history, saved_dir = resume_mode_run
    assert history[1]["stream/midcall_weight_swaps_total"] >= 1
    run_dir = tmp_path / "run"
    shutil.copytree(saved_dir / "global_step_2", run_dir / "global_step_2")
    after, posted, history = _partial_run(
        rl_config,
        monkeypatch,
        RolloutCopyWorker,
        "resume",
        "trainer.resume_mode=auto",
        f"trainer.default_local_dir={run_dir}",
    )
    assert len(after) == 1 and sorted(posted) == [2]  # the resumed step's post, once
    assert_token_versions(after[0], 2)
    gaps = _gaps(after, posted, rl_config().actor_rollout_ref.model.path, "resume")
    assert all(gap < LOGPROB_BOUND for gap in gaps.values()), gaps
