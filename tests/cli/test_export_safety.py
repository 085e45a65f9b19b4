"""``verl export`` / ``verl merge`` against hostile or careless inputs.

- the output never deletes or overlaps a run: a run directory, the checkpoint root, the
  checkpoint itself, its ``actor/huggingface`` (upstream's merge target), the run's final
  ``huggingface/``, a directory containing the checkpoint, or a symlink to any of them are
  refused with the path and the reason, and ``--overwrite`` replaces only a previous export;
- every file is verified against the manifest's CRC-32 before the export: one flipped byte
  (same size) in the single engine's weights, the ``hf_model`` copy or a LoRA adapter is
  refused naming the file; a manifest without checksums needs ``--allow-missing-checksums``;
- a truncated weights file, an unwritable output, too little free space and a full disk in
  the middle of the write are one-line errors, and no half-written export is left.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file

from verl import cli
from verl.cli import export as model_merger
from verl.cli.export import EXPORT_MARKER
from verl.config import load_config
from verl.models.lora import LORA_ADAPTER_DIR
from verl.trainer.lifecycle.checkpoint import LATEST_FILE, MANIFEST_FILE, _crc32, read_manifest

HF_MODEL = "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"
LORA = ("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8")


def _train(tiny_model_dir: Path, run_dir: Path, *extra: str) -> Path:
    """One step of the tiny model, checkpointed: ``run_dir/global_step_1``."""
    from verl.trainer.rl.trainer import RLTrainer

    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "data.train_batch_size=2",
            "data.max_response_length=4",
            "data.arithmetic.train_size=4",
            "data.arithmetic.val_size=2",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=2",
            "trainer.total_training_steps=1",
            "trainer.save_freq=1",
            "trainer.val_before_train=false",
            "trainer.logger=[]",
            "trainer.mixed_precision=none",
            f"trainer.default_local_dir={run_dir}",
            f"trainer.log_dir={run_dir}",
            *extra,
        ]
    )
    RLTrainer(cfg).fit()
    return run_dir / "global_step_1"


@pytest.fixture(scope="module")
def saved_runs(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """A full-weight run and a LoRA run, both with ``hf_model`` in their checkpoints."""
    root = tmp_path_factory.mktemp("export_safety")
    return {
        "full": _train(tiny_model_dir, root / "full", HF_MODEL).parent,
        "lora": _train(tiny_model_dir, root / "lora", HF_MODEL, *LORA).parent,
    }


@pytest.fixture
def run(saved_runs, tmp_path) -> Path:
    """A private copy of the full-weight run directory (tests damage it)."""
    return Path(shutil.copytree(saved_runs["full"], tmp_path / "run", symlinks=True))


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def _export(*args: str) -> int:
    return cli.main(["export", *args])


# ---------------------------------------------------------------------- the output


def test_export_into_the_run_or_checkpoint_is_refused_and_deletes_nothing(run, tmp_path, capsys):
    ckpt = run / "global_step_1"
    before = _snapshot(run)
    (tmp_path / "link_to_run").symlink_to(run)
    other = Path(shutil.copytree(run, tmp_path / "other_run", symlinks=True))
    before_other = _snapshot(other)
    cases = {
        str(run): "contains the checkpoint",
        str(tmp_path / "link_to_run"): "contains the checkpoint",
        str(other): "is a run directory",
        str(other / "huggingface"): "which the run in",
        str(tmp_path): "contains the checkpoint",
        str(ckpt): "is the checkpoint",
        str(ckpt / "actor"): "is inside the checkpoint",
        str(ckpt / "actor" / "huggingface"): "is inside the checkpoint",
        str(run / "huggingface"): "which the run in",
        str(run / "global_step_7"): "which the run in",
        str(run / LATEST_FILE): "which the run in",
    }
    for out, why in cases.items():
        for extra in ([], ["--overwrite"]):
            assert _export("--checkpoint", str(ckpt), "--out", out, *extra) == 2, out
            err = capsys.readouterr().err
            assert err.startswith("error: --out ") and why in err, (out, err)
            assert out in err
            assert "Traceback" not in err
    assert _snapshot(run) == before and _snapshot(other) == before_other
    read_manifest(ckpt, verify=True)


def test_upstream_merge_into_the_checkpoints_huggingface_folder_is_refused(run, capsys):
    ckpt = run / "global_step_1"
    before = _snapshot(run)
    target = ckpt / "actor" / "huggingface"
    args = ["merge", "merge", "--backend", "fsdp", "--local_dir", str(ckpt / "actor")]
    assert cli.main([*args, "--target_dir", str(target), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert f"--out {target} is inside the checkpoint {ckpt} being exported" in err
    assert "huggingface/ folder too" in err
    assert _snapshot(run) == before


def test_a_directory_that_holds_another_run_is_not_an_export(run, tmp_path, capsys):
    other = tmp_path / "runs"
    shutil.copytree(run, other / "exp2")
    before = _snapshot(other)
    ckpt = run / "global_step_1"
    assert _export("--checkpoint", str(ckpt), "--out", str(other), "--overwrite") == 2
    assert "is not a previous export" in capsys.readouterr().err
    # an unrelated directory of the user's, too
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "todo.txt").write_text("keep")
    assert _export("--checkpoint", str(ckpt), "--out", str(mine), "--overwrite") == 2
    assert "is not a previous export" in capsys.readouterr().err
    assert (mine / "todo.txt").read_text() == "keep"
    assert _snapshot(other) == before


def test_overwrite_replaces_a_previous_export(run, tmp_path, capsys):
    ckpt = run / "global_step_1"
    out = tmp_path / "hf"
    assert _export("--checkpoint", str(ckpt), "--out", str(out)) == 0
    marker = json.loads((out / EXPORT_MARKER).read_text())
    assert marker["global_step"] == 1 and marker["role"] == "actor"
    assert _export("--checkpoint", str(ckpt), "--out", str(out)) == 2
    assert "pass --overwrite to replace it" in capsys.readouterr().err
    (out / "stale.txt").write_text("from the previous export")
    assert _export("--checkpoint", str(ckpt), "--out", str(out), "--overwrite") == 0
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    # an export written before the marker existed (config.json + *.safetensors) also counts
    (out / EXPORT_MARKER).unlink()
    assert _export("--checkpoint", str(ckpt), "--out", str(out), "--overwrite") == 0
    assert (out / EXPORT_MARKER).is_file()
    # a new folder inside the run directory overlaps nothing of the run
    inside = run / "exports" / "step1"
    assert _export("--checkpoint", str(ckpt), "--out", str(inside)) == 0
    assert (
        load_file(inside / "model.safetensors").keys()
        == load_file(out / "model.safetensors").keys()
    )


# ---------------------------------------------------------------------- checksums


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("kind", "damaged"),
    [
        ("full", "actor/model.safetensors"),
        ("full", "actor/huggingface/model.safetensors"),
        ("lora", "actor/model.safetensors"),
        ("lora", f"actor/huggingface/{LORA_ADAPTER_DIR}/adapter_model.safetensors"),
    ],
    ids=["single-engine-weights", "hf-model-copy", "lora-engine-weights", "lora-adapter"],
)
def test_a_flipped_byte_is_refused_naming_the_file(saved_runs, tmp_path, capsys, kind, damaged):
    run = Path(shutil.copytree(saved_runs[kind], tmp_path / "run"))
    ckpt = run / "global_step_1"
    size = (ckpt / damaged).stat().st_size
    _flip_last_byte(ckpt / damaged)
    assert (ckpt / damaged).stat().st_size == size
    out = tmp_path / "hf"
    assert _export("--checkpoint", str(ckpt), "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert "is damaged" in err and f"{damaged}: CRC-32" in err, err
    assert not out.exists()
    # the same through upstream's command line
    args = ["merge", "--local_dir", str(ckpt / "actor"), "--target_dir", str(out)]
    assert cli.main(args) == 2
    assert f"{damaged}: CRC-32" in capsys.readouterr().err
    assert not out.exists()


def test_a_manifest_without_checksums_needs_the_flag(run, tmp_path, capsys):
    ckpt = run / "global_step_1"
    manifest = json.loads((ckpt / MANIFEST_FILE).read_text())
    del manifest["crc32"]
    (ckpt / MANIFEST_FILE).write_text(json.dumps(manifest))
    out = tmp_path / "hf"
    assert _export("--checkpoint", str(ckpt), "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert "has no CRC-32 for" in err and "--allow-missing-checksums" in err
    assert not out.exists()
    assert _export("--checkpoint", str(ckpt), "--out", str(out), "--allow-missing-checksums") == 0
    assert (out / "model.safetensors").is_file()


# ---------------------------------------------------------------------- bad files, full disks


def test_a_truncated_weights_file_is_a_message(run, tmp_path, capsys):
    """Truncated, with the manifest made to match: the reader's error becomes one line."""
    ckpt = run / "global_step_1"
    weights = ckpt / "actor" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert _export("--checkpoint", str(ckpt), "--out", str(tmp_path / "a")) == 2
    assert "actor/model.safetensors: " in capsys.readouterr().err  # the size differs
    manifest = json.loads((ckpt / MANIFEST_FILE).read_text())
    manifest["files"]["actor/model.safetensors"] = weights.stat().st_size
    manifest["crc32"]["actor/model.safetensors"] = _crc32(weights)
    (ckpt / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert _export("--checkpoint", str(ckpt), "--out", str(tmp_path / "b")) == 2
    err = capsys.readouterr().err
    assert "model.safetensors is not a readable safetensors file (truncated or damaged?)" in err
    assert "Traceback" not in err
    assert not (tmp_path / "b").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".b")]


def test_an_unwritable_output_fails_before_reading_weights(run, capsys, monkeypatch):
    read = []
    monkeypatch.setattr(model_merger, "load_role_state_dict", lambda d: read.append(d) or {})
    out = "/dev/full/hf"  # its parent is not a directory
    assert _export("--checkpoint", str(run / "global_step_1"), "--out", out) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: writing the export to {out} failed") and not read


def test_a_full_disk_in_the_middle_leaves_no_half_written_export(
    run, tmp_path, capsys, monkeypatch
):
    ckpt = run / "global_step_1"
    out = tmp_path / "hf"
    assert _export("--checkpoint", str(ckpt), "--out", str(out)) == 0
    before = _snapshot(out)

    def full(src, dst, *a, **k):  # the weights are written; the tokenizer files do not fit
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    monkeypatch.setattr(model_merger.shutil, "copy2", full)
    assert _export("--checkpoint", str(ckpt), "--out", str(out), "--overwrite") == 1
    err = capsys.readouterr().err
    assert "the disk is full: free space or choose another --out (ENOSPC)" in err
    assert "a previous export there is untouched" in err
    assert _snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".hf")) == []


def test_too_little_free_space_is_refused_before_writing(run, tmp_path, capsys, monkeypatch):
    real = shutil.disk_usage

    def small(path):
        usage = real(path)
        return usage._replace(free=1 << 20)

    monkeypatch.setattr(model_merger.shutil, "disk_usage", small)
    out = tmp_path / "hf"
    assert _export("--checkpoint", str(run / "global_step_1"), "--out", str(out)) == 1
    err = capsys.readouterr().err
    assert "not enough space to export" in err and "1.0 MiB are free" in err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".hf")]


def test_a_real_full_disk(run, tmp_path, capsys):
    """A 256 KiB tmpfs (needs root): the size check refuses before writing anything."""
    disk = tmp_path / "small"
    disk.mkdir()
    if (
        shutil.which("mount") is None
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True
        ).returncode
    ):
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    try:
        assert _export("--checkpoint", str(run / "global_step_1"), "--out", str(disk / "hf")) == 1
        assert "not enough space to export" in capsys.readouterr().err
        assert os.listdir(disk) == []
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
