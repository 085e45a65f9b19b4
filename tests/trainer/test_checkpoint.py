"""Run checkpoints of the RL trainer (``verl/trainer/lifecycle/checkpoint.py``, ``resume.py``) and export.

Single-process runs on the tiny model: exact resume (N steps == N/2 + crash + resume + N/2,
metrics and weights bit for bit, with sampled rollouts), a SIGKILL in the middle of a save
in a child process, a full disk, retention and the ``latest`` pointer, refusal of a
changed config, ``resume_path`` errors, and ``verl.cli.export`` (log-probs and values of
the exported model against the live workers). The two-rank FSDP2 version (Ray, slow) resumes
within 1e-6, exports a sharded checkpoint and loads it into one process.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from verl.cli.export import merge_checkpoint
from verl.config import ConfigError, load_config, to_yaml
from verl.model_merger import main as merger_main
from verl.testing import assert_bitwise, assert_same_metrics, checkpoint_tensors
from verl.trainer.lifecycle.checkpoint import (
    LATEST_FILE,
    MANIFEST_FILE,
    CheckpointError,
    CheckpointManager,
    complete_checkpoints,
    read_manifest,
)
from verl.trainer.lifecycle.resume import resume_checkpoint_path
from verl.trainer.lifecycle.run_lock import LOCK_FILE
from verl.trainer.rl.trainer import RLTrainer

# Four steps with everything that carries state from step to step: sampled rollouts from
# the global RNG (rollout.seed null), a critic (GAE), an adaptive in-reward KL coefficient,
# running reward normalisation, a cosine LR schedule, PPO mini-batch shuffling, sampled
# validation every 2 steps, and 10 prompts in batches of 4 (epochs cross mid-stream).
EXACT = (
    "trainer.total_training_steps=4",
    "trainer.save_freq=2",
    "trainer.test_freq=2",
    "trainer.val_before_train=false",
    "data.arithmetic.train_size=10",
    "algorithm.adv_estimator=gae",
    "critic.ppo_mini_batch_size=2",
    "critic.ppo_micro_batch_size_per_device=2",
    "critic.optim.lr=1e-3",
    "algorithm.use_kl_in_reward=true",
    "algorithm.kl_ctrl.type=adaptive",
    "algorithm.kl_ctrl.horizon=50",
    "reward_model.normalize=true",
    "actor_rollout_ref.actor.optim.warmup_style=cosine",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=1",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
)

REWARD = (
    "def varied(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return {'score': (len(solution_str) % 5) / 4.0, 'acc': float(len(solution_str) % 2)}\n"
)


class _Crash(Exception):
    """Stands for a crash of the run in the middle of a step."""


def _reward_overrides(tmp_path: Path) -> tuple[str, ...]:
    path = tmp_path / "reward.py"
    path.write_text(REWARD)
    return (f"custom_reward_function.path={path}", "custom_reward_function.name=varied")


def _crash_at(trainer: RLTrainer, step: int) -> None:
    """Make ``trainer`` fail at the start of step ``step`` (after saving the earlier ones)."""
    real = trainer.train_step

    def train_step(*args: Any, **kwargs: Any) -> dict[str, Any]:
        if trainer.global_step >= step:
            raise _Crash(f"crash at step {step}")
        return real(*args, **kwargs)

    trainer.train_step = train_step


def _straight_run(rl_config, tmp_path: Path, *extra: str) -> tuple[list[dict], Path]:
    """The uninterrupted run of :data:`EXACT` (+ ``extra``): its history and directory."""
    out = tmp_path / "straight"
    trainer = RLTrainer(
        rl_config(
            *EXACT,
            *_reward_overrides(tmp_path),
            f"trainer.default_local_dir={out}",
            f"trainer.log_dir={out}",
            *extra,
        )
    )
    trainer.fit()
    return trainer.history, out


# ---------------------------------------------------------------------- exact resume


@pytest.mark.parametrize(
    "variant",
    [
        # rollout.seed null: the native sampler draws from torch's global generator
        (),
        # a fixed rollout.seed: the transformers backend, seeded per call by the counters
        ("actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.seed=5"),
        # DAPO dynamic sampling: a step may draw several prompt batches from the loader
        (
            "algorithm.adv_estimator=grpo",
            "algorithm.filter_groups.enable=true",
            "algorithm.filter_groups.metric=score",
        ),
        # one-step-off async rollout: the in-flight batch is saved with the checkpoint
        ("trainer.async_rollout=true", "actor_rollout_ref.actor.rollout_is_threshold=2.0"),
    ],
    ids=["native-global-rng", "hf-seeded", "dynamic-sampling", "async"],
)
def test_resume_is_bit_exact(rl_config, tmp_path, variant):
    straight_history, straight_dir = _straight_run(rl_config, tmp_path, *variant)

    run_dir = tmp_path / "resumed"
    cfg = rl_config(
        *EXACT,
        *_reward_overrides(tmp_path),
        f"trainer.default_local_dir={run_dir}",
        f"trainer.log_dir={run_dir}",
        *variant,
    )
    first = RLTrainer(cfg)
    _crash_at(first, 3)
    with pytest.raises(_Crash):
        first.fit()
    assert [p.name for _, p in complete_checkpoints(run_dir)] == ["global_step_2"]

    # A new trainer in the same process: everything it built (model init, seeding) moved the
    # global RNG to where the first run was at step 0, so only the restored state can match.
    second = RLTrainer(cfg)
    second.fit()
    assert second.resumed_from == run_dir / "global_step_2"

    assert_same_metrics(first.history + second.history, straight_history)
    assert_bitwise(
        checkpoint_tensors(run_dir / "global_step_4"),
        checkpoint_tensors(straight_dir / "global_step_4"),
    )
    assert_bitwise(
        load_file(run_dir / "huggingface" / "model.safetensors"),
        load_file(straight_dir / "huggingface" / "model.safetensors"),
    )
    saved = json.loads((run_dir / "global_step_4" / "trainer_state.json").read_text())
    want = json.loads((straight_dir / "global_step_4" / "trainer_state.json").read_text())
    for key in ("dataloader", "kl_ctrl", "reward_fn", "rng"):
        assert saved[key] == want[key], key
    if "trainer.async_rollout=true" in variant:
        assert saved["async_rollout"] == want["async_rollout"]
        assert [m["async/staleness_max"] for m in straight_history] == [0.0, 1.0, 1.0, 1.0]
        assert len(saved["async_rollout"]["inflight"]) == 1  # batch 5 was in flight
    if "algorithm.filter_groups.enable=true" in variant:
        drawn = sum(m["dapo/num_gen_batches"] for m in straight_history)
        assert drawn > 4  # some steps drew extra batches, moving the loader further
        assert saved["dataloader"]["sampler"]["epoch"] * 2 + saved["dataloader"]["sampler"][
            "position"
        ] == int(drawn)
    else:
        # async: the loader runs one batch ahead (batch 5 was drawn), into the next epoch
        ahead = "trainer.async_rollout=true" in variant
        assert [m["training/epoch"] for m in second.history] == [1.0, 2.0 if ahead else 1.0]
        assert saved["kl_ctrl"]["value"] != 0.001  # the adaptive controller moved


_CHILD = """
import sys, time
from pathlib import Path

import verl.trainer.lifecycle.resume as resume
from verl.config import load_config
from verl.trainer.rl.trainer import RLTrainer

marker = Path(sys.argv[1])
real_write = resume.write_json_atomic


def write_json_atomic(path, obj):
    # The engines of step 4 are written; pause before the trainer state and the manifest.
    if "global_step_4" in str(path):
        marker.touch()
        time.sleep(600)
    real_write(path, obj)


resume.write_json_atomic = write_json_atomic
RLTrainer(load_config(sys.argv[2])).fit()
"""


def _jsonl_steps(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    out = [
        {k: float(v) for k, v in row.items() if k not in ("step", "time")}
        for row in rows
        if "actor/pg_loss" in row
    ]
    return out


@pytest.mark.slow  # three training runs, one in a child process killed mid-save
def test_kill_during_save_resumes_from_last_complete_checkpoint(rl_config, tmp_path):
    threads = f"trainer.num_threads={torch.get_num_threads()}"  # same float reductions
    straight_history, straight_dir = _straight_run(rl_config, tmp_path, threads)

    run_dir = tmp_path / "killed"
    cfg = rl_config(
        *EXACT,
        *_reward_overrides(tmp_path),
        threads,
        f"trainer.default_local_dir={run_dir}",
        f"trainer.log_dir={run_dir}",
    )
    marker = tmp_path / "paused"
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    config_file = tmp_path / "run.yaml"
    config_file.write_text(to_yaml(cfg))
    child = subprocess.Popen(
        [sys.executable, str(script), str(marker), str(config_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        # its own process group: the SIGKILL below also ends the reward worker processes
        # it forked, which would otherwise outlive the test
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not marker.exists():
            if child.poll() is not None:
                pytest.fail(f"child exited early: {child.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, "the child never reached the step-4 save"
            time.sleep(0.2)
        os.killpg(child.pid, signal.SIGKILL)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL

    partial = [p for p in run_dir.iterdir() if p.name.startswith(".global_step_4.tmp-")]
    assert len(partial) == 1 and (partial[0] / "actor" / "model.safetensors").is_file()
    assert not (run_dir / "global_step_4").exists()
    assert (run_dir / LATEST_FILE).read_text().strip() == "2"
    with pytest.raises(CheckpointError, match="temporary directory of an interrupted"):
        read_manifest(partial[0])

    # Auto-resume in this (new) process: the partial save is ignored and cleaned away.
    resumed = RLTrainer(cfg)
    resumed.fit()
    assert resumed.resumed_from == run_dir / "global_step_2"
    assert not partial[0].exists()
    child_history = _jsonl_steps(run_dir / "metrics.jsonl")[:2]
    assert_same_metrics(child_history + resumed.history, straight_history)
    assert_bitwise(
        checkpoint_tensors(run_dir / "global_step_4"),
        checkpoint_tensors(straight_dir / "global_step_4"),
    )
    assert (run_dir / LATEST_FILE).read_text().strip() == "4"


# ---------------------------------------------------------------------- failures


def test_disk_full_during_save_keeps_the_previous_checkpoint(rl_config, tmp_path, monkeypatch):
    run_dir = tmp_path / "full"
    cfg = rl_config(*EXACT, f"trainer.default_local_dir={run_dir}", f"trainer.log_dir={run_dir}")
    real_save = torch.save

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if "global_step_4" in str(f):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    trainer = RLTrainer(cfg)
    with pytest.raises(CheckpointError) as err:
        trainer.fit()
    message = str(err.value)
    assert "global_step_4" in message and "disk is full" in message
    assert str(run_dir / "global_step_2") in message
    assert sorted(p.name for p in run_dir.iterdir() if "global_step" in p.name) == [
        "global_step_2"
    ]  # no temporary directory left either
    assert (run_dir / LATEST_FILE).read_text().strip() == "2"

    monkeypatch.setattr(torch, "save", real_save)
    again = RLTrainer(
        rl_config(
            *EXACT,
            f"trainer.default_local_dir={run_dir}",
            f"trainer.log_dir={run_dir}",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={run_dir / 'global_step_2'}",
        )
    )
    again.fit()
    assert again.resumed_from == run_dir / "global_step_2"
    assert [p.name for _, p in complete_checkpoints(run_dir)] == [
        "global_step_2",
        "global_step_4",
    ]


def test_manager_save_failure_leaves_no_trace(tmp_path):
    manager = CheckpointManager(tmp_path)

    def good(tmp: Path) -> dict:
        (tmp / "weights.bin").write_bytes(b"x" * 10)
        return {"roles": {}}

    def bad(tmp: Path) -> dict:
        (tmp / "weights.bin").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    manager.save(1, good)
    with pytest.raises(CheckpointError, match="disk is full"):
        manager.save(2, bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", LATEST_FILE]
    assert manager.latest() == tmp_path / "global_step_1"

    # A damaged checkpoint (a file shorter than when saved) is not complete.
    manager.save(3, good)
    (tmp_path / "global_step_3" / "weights.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="damaged"):
        read_manifest(tmp_path / "global_step_3")
    assert manager.latest() == tmp_path / "global_step_1"


# ---------------------------------------------------------------------- layout and retention


def test_retention_latest_pointer_and_contents(rl_config, tmp_path):
    run_dir = tmp_path / "kept"
    cfg = rl_config(
        "trainer.total_training_steps=3",
        "trainer.save_freq=1",
        "trainer.max_ckpt_to_keep=2",
        "trainer.val_before_train=false",
        f"trainer.default_local_dir={run_dir}",
    )
    result = RLTrainer(cfg).fit()
    assert result["checkpoint"] == str(run_dir / "global_step_3")
    assert [p.name for _, p in complete_checkpoints(run_dir)] == ["global_step_2", "global_step_3"]
    assert not (run_dir / "global_step_1").exists()
    assert (run_dir / LATEST_FILE).read_text() == "3\n"
    # no temporary or trash directory left; the run's lock file stays (released, empty)
    hidden = [p for p in run_dir.iterdir() if p.name.startswith(".")]
    assert hidden == [run_dir / LOCK_FILE] and (run_dir / LOCK_FILE).read_text() == ""

    step3 = run_dir / "global_step_3"
    manifest = read_manifest(step3)
    assert manifest["global_step"] == 3
    assert manifest["roles"] == {
        "actor_rollout_ref": {"dir": "actor", "world_size": 1, "strategy": "single"}
    }
    for name in (
        "actor/model.safetensors",
        "actor/optim_tensors.pt",
        "actor/engine_state.json",
        "actor/worker_state_rank0.json",
        "actor/huggingface/config.json",
        "actor/huggingface/tokenizer.json",
        "trainer_state.json",
        "config.yaml",
    ):
        assert name in manifest["files"], name
    # Nothing that needs unpickling: the only torch file is weights-only loadable.
    torch_files = [n for n in manifest["files"] if n.endswith((".pt", ".pth", ".bin", ".pkl"))]
    assert torch_files == ["actor/optim_tensors.pt"]
    torch.load(step3 / torch_files[0], weights_only=True)
    saved_cfg = load_config(step3 / "config.yaml")
    assert saved_cfg == cfg
    state = json.loads((step3 / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    assert state["dataloader"]["sampler"]["position"] == 3
    worker = json.loads((step3 / "actor" / "worker_state_rank0.json").read_text())
    assert worker["counters"] == {"update_calls": 3, "generate_calls": 3}
    assert set(worker["rng"]) == {"torch_cpu", "numpy", "python", "torch_cuda"}
    assert MANIFEST_FILE not in manifest["files"]


# ---------------------------------------------------------------------- refusals and errors


def test_changed_model_or_data_is_refused_unless_forced(rl_config, tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    base = (
        "trainer.save_freq=2",
        "trainer.val_before_train=false",
        f"trainer.default_local_dir={run_dir}",
    )
    RLTrainer(rl_config(*base, "trainer.total_training_steps=2")).fit()

    # The same model directory through another spelling of its path is no change, and a
    # longer run (total_training_steps) is allowed: it continues from step 2.
    relative = os.path.relpath(tiny_model_dir)
    same = RLTrainer(
        rl_config(
            *base, f"actor_rollout_ref.model.path={relative}", "trainer.total_training_steps=3"
        )
    )
    same.fit()
    assert same.resumed_from == run_dir / "global_step_2"
    assert [len(same.history), same.global_step] == [1, 3]

    moved = tmp_path / "same_model_elsewhere"
    shutil.copytree(tiny_model_dir, moved)
    changed = (
        *base,
        f"actor_rollout_ref.model.path={moved}",
        "data.seed=7",
        "trainer.total_training_steps=4",
    )
    trainer = RLTrainer(rl_config(*changed))
    with pytest.raises(CheckpointError) as err:
        trainer.fit()
    message = str(err.value)
    assert "refusing to resume" in message and "global_step_3" in message
    assert f"actor_rollout_ref.model.path: checkpoint '{relative}', now '{moved}'" in message
    assert "data.seed: checkpoint 1, now 7" in message
    assert "total_training_steps" not in message  # allowed: only logged
    assert "trainer.resume_force=true" in message
    assert trainer.global_step == 0

    forced = RLTrainer(rl_config(*changed, "trainer.resume_force=true"))
    forced.fit()
    assert forced.resumed_from == run_dir / "global_step_3"
    assert [len(forced.history), forced.global_step] == [1, 4]


def test_resume_path_errors(rl_config, tmp_path):
    run_dir = tmp_path / "run"
    RLTrainer(
        rl_config(
            "trainer.total_training_steps=1",
            "trainer.save_freq=1",
            "trainer.val_before_train=false",
            f"trainer.default_local_dir={run_dir}",
        )
    ).fit()
    manager = CheckpointManager(run_dir)

    def resume_from(path: Path) -> Path | None:
        cfg = rl_config("trainer.resume_mode=resume_path", f"trainer.resume_from_path={path}")
        return resume_checkpoint_path(cfg, manager)

    assert resume_from(run_dir / "global_step_1") == run_dir / "global_step_1"
    with pytest.raises(ConfigError, match=r"resume_from_path.*does not exist"):
        resume_from(run_dir / "global_step_9")
    with pytest.raises(CheckpointError, match=r"run directory: did you mean .*global_step_1"):
        resume_from(run_dir)
    incomplete = run_dir / "global_step_5"
    shutil.copytree(run_dir / "global_step_1", incomplete)
    (incomplete / MANIFEST_FILE).unlink()
    with pytest.raises(CheckpointError, match="not a complete checkpoint: it has no checkpoint"):
        resume_from(incomplete)
    temp = run_dir / ".global_step_6.tmp-1-abc"
    shutil.copytree(run_dir / "global_step_1", temp)
    with pytest.raises(CheckpointError, match="temporary directory of an interrupted"):
        resume_from(temp)
    # auto ignores both and takes the newest complete one; disable takes none
    assert resume_checkpoint_path(rl_config(), manager) == run_dir / "global_step_1"
    assert resume_checkpoint_path(rl_config("trainer.resume_mode=disable"), manager) is None

    # Through the trainer: the error comes before any step, and the workers are released.
    trainer = RLTrainer(
        rl_config(
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={incomplete}",
            f"trainer.default_local_dir={tmp_path / 'other'}",
        )
    )
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        trainer.fit()
    assert trainer.global_step == 0 and not trainer.placement.pools


# ---------------------------------------------------------------------- export


def _hf_log_probs(model_dir: Path, gen) -> torch.Tensor:
    """Log-probs of the sampled response tokens under a plain HF forward of ``model_dir``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    b = gen.batch
    response_len = b["responses"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"],
            attention_mask=b["attention_mask"],
            position_ids=b["position_ids"],
        ).logits
    logits = logits[:, -response_len - 1 : -1].float() / gen.meta_info.get("temperature", 1.0)
    return logits.log_softmax(-1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)


def _live_outputs(trainer: RLTrainer, batch) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
    """Responses to ``batch`` and the live workers' log-probs (and critic values) of them."""
    gen, _ = trainer.generate_and_score(batch)
    log_probs = trainer.actor_rollout_wg.compute_log_prob(gen).batch["old_log_probs"]
    values = None
    if trainer.critic_wg is not None:
        values = trainer.critic_wg.compute_values(gen).batch["values"]
    return gen, log_probs, values


def _export_diffs(
    checkpoint: Path, out_dir: Path, gen, log_probs: torch.Tensor, values: torch.Tensor | None
) -> dict[str, float]:
    """Export ``checkpoint`` and return the max |difference| of its response log-probs (and
    critic values) from the live workers' ``log_probs`` / ``values``."""
    from verl.models import CausalLMWithValueHead

    b = gen.batch
    mask = b["response_mask"].bool()
    diffs = {}
    actor_dir = merge_checkpoint(checkpoint, out_dir / "actor")
    diffs["log_prob"] = (_hf_log_probs(actor_dir, gen) - log_probs)[mask].abs().max().item()
    if values is not None:
        critic_dir = merge_checkpoint(checkpoint, out_dir / "critic", role="critic")
        critic = CausalLMWithValueHead.from_pretrained(critic_dir).eval()
        with torch.no_grad():
            exported = critic(
                input_ids=b["input_ids"],
                attention_mask=b["attention_mask"],
                position_ids=b["position_ids"],
            )
        response_len = b["responses"].shape[1]
        exported = exported[:, -response_len - 1 : -1].float()
        diffs["value"] = (exported - values)[mask].abs().max().item()
    return diffs


def test_export_gives_the_trained_actor_and_critic(rl_config, tmp_path, tiny_model_dir):
    trainer = RLTrainer(
        rl_config(
            "algorithm.adv_estimator=gae",
            "critic.ppo_mini_batch_size=2",
            "critic.ppo_micro_batch_size_per_device=2",
            CRITIC_HF_MODEL,
            f"trainer.default_local_dir={tmp_path / 'run'}",
        )
    )
    try:
        batches = iter(trainer.train_loader)
        trainer.global_step = 1
        trainer.train_step(next(batches))
        checkpoint = trainer.save_checkpoint()
        live = _live_outputs(trainer, next(batches))
    finally:
        trainer.close()
    diffs = _export_diffs(checkpoint, tmp_path / "hf", *live)
    assert diffs["log_prob"] < 1e-5 and diffs["value"] < 1e-5, diffs
    actor = tmp_path / "hf" / "actor"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(actor))
    from transformers import AutoTokenizer

    text = "What is 12 + 7?\nAnswer: 19"
    exported = AutoTokenizer.from_pretrained(actor)(text)["input_ids"]
    assert exported == AutoTokenizer.from_pretrained(tiny_model_dir)(text)["input_ids"]
    # the critic's hf_model: the checkpoint holds what the export wrote, bit for bit
    assert_same_critic_files(checkpoint / "critic" / "huggingface", tmp_path / "hf" / "critic")


HF_MODEL = "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"
CRITIC_HF_MODEL = "critic.checkpoint.save_contents=[model,optimizer,extra,hf_model]"
HF_WEIGHTS = Path("huggingface") / "model.safetensors"  # under a checkpoint's actor/


def assert_same_critic_files(saved: Path, exported: Path) -> None:
    """A checkpoint's critic/huggingface and ``verl export --role critic``'s directory
    hold the same body and value head, and the saved one loads as a critic."""
    from verl.models import CausalLMWithValueHead
    from verl.models.value_model import VALUE_HEAD_FILENAME

    for name in ("model.safetensors", VALUE_HEAD_FILENAME):
        assert_bitwise(load_file(saved / name), load_file(exported / name))
    CausalLMWithValueHead.from_pretrained(saved)


def test_hf_model_in_save_contents_puts_a_loadable_model_in_each_checkpoint(rl_config, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = tmp_path / "run"
    cfg = rl_config(
        "trainer.total_training_steps=1",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
        HF_MODEL,
        f"trainer.default_local_dir={run_dir}",
    )
    result = RLTrainer(cfg).fit()
    step1 = run_dir / "global_step_1"
    hf = step1 / "actor" / "huggingface"
    assert "actor/huggingface/model.safetensors" in read_manifest(step1, verify=True)["files"]
    weights = load_file(hf / "model.safetensors")
    # the weights of the run's final export (the same step), bit for bit
    assert_bitwise(weights, load_file(Path(result["hf_dir"]) / "model.safetensors"))
    # verl export of the checkpoint builds them from the engine's state: the same again
    merged = merge_checkpoint(step1, tmp_path / "merged")
    assert_bitwise(load_file(merged / "model.safetensors"), weights)
    # upstream verl's command for the same export
    upstream = ["merge", "--backend", "fsdp", "--local_dir", str(step1 / "actor")]
    assert merger_main([*upstream, "--target_dir", str(tmp_path / "upstream")]) == 0
    assert_bitwise(load_file(tmp_path / "upstream" / "model.safetensors"), weights)
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    assert_bitwise(
        {k: v for k, v in model.state_dict().items() if k in weights},
        weights,
    )
    assert AutoTokenizer.from_pretrained(hf)("1 + 2")["input_ids"]
    # resume reads the engine's state, not the HF copy: a run resumes from this checkpoint
    # (an upstream config's explicit load_contents says what null does)
    longer = RLTrainer(
        rl_config(
            "trainer.total_training_steps=2",
            "trainer.save_freq=1",
            "trainer.val_before_train=false",
            HF_MODEL,
            "actor_rollout_ref.actor.checkpoint.load_contents=[model,optimizer,extra]",
            f"trainer.default_local_dir={run_dir}",
        )
    )
    longer.fit()
    assert longer.resumed_from == step1 and longer.global_step == 2


def test_export_cli_errors(tmp_path, capsys):
    assert merger_main(["--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "half").mkdir()
    assert merger_main(["--checkpoint", str(tmp_path / "half"), "--out", str(tmp_path / "o")]) == 2
    assert "not a complete checkpoint" in capsys.readouterr().err
    manager = CheckpointManager(tmp_path / "run")
    manager.save(1, lambda tmp: {"roles": {}})
    args = ["--checkpoint", str(tmp_path / "run" / "global_step_1"), "--out", str(tmp_path / "o")]
    assert merger_main([*args, "--role", "critic"]) == 2
    assert "has no critic" in capsys.readouterr().err
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep.txt").write_text("x")
    assert merger_main(args) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    from verl import cli

    assert cli.main(["export", "--checkpoint", str(tmp_path / "nope"), "--out", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
    # upstream's command line, through verl merge: a role the checkpoint lacks is named
    step = tmp_path / "run" / "global_step_1"
    args = ["merge", "--local_dir", str(step / "critic"), "--target_dir", str(tmp_path / "t")]
    assert merger_main(args) == 2
    assert "has no critic" in capsys.readouterr().err


# ---------------------------------------------------------------------- two FSDP2 ranks


@pytest.mark.slow
def test_two_fsdp2_ranks_resume_export_and_load_in_one_process(rl_config, ray_session, tmp_path):
    two_ranks = (
        "trainer.n_gpus_per_node=2",
        "trainer.device=cpu",
        *_reward_overrides(tmp_path),
        *(o for o in EXACT if "test_freq" not in o and "val_kwargs" not in o),
    )
    straight_dir, run_dir = tmp_path / "straight", tmp_path / "run"
    # hf_model: the ranks gather the full weights for rank 0 to write at every save
    hf_saves = (HF_MODEL, CRITIC_HF_MODEL)
    straight = RLTrainer(
        rl_config(*two_ranks, *hf_saves, f"trainer.default_local_dir={straight_dir}")
    )
    assert straight.actor_rollout_wg.world_size == 2
    straight.fit()

    # the run resumes from the straight run's step-2 checkpoint, as after a crash in step 3
    cfg = rl_config(*two_ranks, *hf_saves, f"trainer.default_local_dir={run_dir}")
    shutil.copytree(straight_dir / "global_step_2", run_dir / "global_step_2")
    manifest = read_manifest(run_dir / "global_step_2")
    assert manifest["roles"]["actor_rollout_ref"] == {
        "dir": "actor",
        "world_size": 2,
        "strategy": "fsdp2",
    }
    assert "actor/worker_state_rank1.json" in manifest["files"]
    assert any(name.startswith("critic/model_optim/") for name in manifest["files"])

    # New Ray actors (new processes) resume; keep them alive after fit() to compare the
    # export with the live, sharded workers.
    second = RLTrainer(cfg)
    close, second.close = second.close, lambda: None
    try:
        second.fit()
        assert second.resumed_from == run_dir / "global_step_2"
        live = _live_outputs(second, next(iter(second.train_loader)))
    finally:
        close()
    assert_same_metrics(second.history, straight.history[2:], tol=1e-6)
    got = load_file(run_dir / "huggingface" / "model.safetensors")
    want = load_file(straight_dir / "huggingface" / "model.safetensors")
    assert got.keys() == want.keys()
    assert max((got[k] - want[k]).abs().max().item() for k in got) < 1e-6
    assert_bitwise(load_file(run_dir / "global_step_4" / "actor" / HF_WEIGHTS), got)

    diffs = _export_diffs(run_dir / "global_step_4", tmp_path / "hf", *live)
    assert diffs["log_prob"] < 1e-5 and diffs["value"] < 1e-5, diffs
    assert_same_critic_files(
        run_dir / "global_step_4" / "critic" / "huggingface", tmp_path / "hf" / "critic"
    )

    # The two-rank checkpoint in one process (single engine): DCP re-shards to full tensors.
    one = RLTrainer(
        rl_config(
            *two_ranks[2:],
            "trainer.total_training_steps=5",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={run_dir / 'global_step_4'}",
            f"trainer.default_local_dir={tmp_path / 'one'}",
        )
    )
    assert one.actor_rollout_wg.world_size == 1 and one.placement.backend == "local"
    try:
        one.resume()
        loaded = one.actor_rollout_wg.state_dict_for_save()[0]
    except BaseException:
        one.close()
        raise
    exported = load_file(tmp_path / "hf" / "actor" / "model.safetensors")
    assert exported.keys() <= loaded.keys()
    assert all(torch.equal(loaded[k], exported[k]) for k in exported)
    one.fit()
    assert [one.global_step, len(one.history)] == [5, 1]
    assert math.isfinite(one.history[0]["actor/pg_loss"])
