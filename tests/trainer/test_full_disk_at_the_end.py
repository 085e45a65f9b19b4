"""A full disk at the end of a run, and while logging metrics, never loses the run.

With the default ``trainer.save_freq=-1`` the final HF export is all a run leaves. When it
does not fit (checked before writing) or its write fails (``ENOSPC`` from safetensors or an
``OSError``), the run's state is saved as a checkpoint instead and the run ends with a
:class:`FinalExportError` naming it; when the checkpoint does not fit either, the error says
that neither does. A metrics backend that hits a full disk warns once and training goes on;
``metrics.jsonl`` keeps no torn row.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess

import pytest
import torch
import transformers.modeling_utils
from safetensors import SafetensorError

import verl.trainer.lifecycle.final_export as final_export
from verl import cli
from verl.trainer.lifecycle.checkpoint import LATEST_FILE, read_manifest
from verl.trainer.lifecycle.final_export import FinalExportError
from verl.trainer.rl.trainer import RLTrainer


def _no_space_safetensors(*args, **kwargs):
    # what safetensors raises on a full disk
    raise SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)"
    )


def _leftovers(run_dir) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("error", ["safetensors", "oserror"])
def test_a_full_disk_in_the_final_export_saves_a_checkpoint_instead(
    rl_config, tmp_path, monkeypatch, error
):
    if error == "safetensors":
        writer = _no_space_safetensors
    else:

        def writer(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[1]))

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", writer)
    trainer = RLTrainer(rl_config())  # save_freq=-1: no checkpoint during the run
    assert trainer.config.trainer.save_freq == -1
    with pytest.raises(FinalExportError) as err:
        trainer.fit()
    message = str(err.value)
    saved = tmp_path / "global_step_2"
    assert f"the final export of the actor to {tmp_path / 'huggingface'} failed" in message
    assert "the disk is full" in message
    assert f"The run's state after step 2 was saved as the checkpoint {saved}" in message
    assert f"verl export --checkpoint {saved} --out {tmp_path / 'huggingface'}" in message
    assert len(trainer.history) == 2
    read_manifest(saved, verify=True)
    assert (tmp_path / LATEST_FILE).read_text().strip() == "2"
    assert not (tmp_path / "huggingface").exists()
    assert [n for n in _leftovers(tmp_path) if n != ".verl-run.lock"] == []

    # nothing was lost: once there is space, the checkpoint exports
    monkeypatch.undo()
    out = tmp_path / "exported"
    assert cli.main(["export", "--checkpoint", str(saved), "--out", str(out)]) == 0
    assert (out / "model.safetensors").is_file()


def test_the_last_checkpoint_is_reused_when_the_last_step_is_saved(
    rl_config, tmp_path, monkeypatch
):
    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", _no_space_safetensors)
    trainer = RLTrainer(rl_config("trainer.save_freq=1"))
    saves = []
    real = trainer.save_checkpoint
    monkeypatch.setattr(trainer, "save_checkpoint", lambda: saves.append(1) or real())
    with pytest.raises(
        FinalExportError, match=r"after step 2 is saved in the checkpoint .*global_step_2"
    ):
        trainer.fit()
    assert len(saves) == 2  # steps 1 and 2 by the loop; none more by the fallback


def test_too_little_space_is_found_before_writing(rl_config, tmp_path, monkeypatch):
    monkeypatch.setattr(final_export, "_free_bytes", lambda path: 1 << 20)
    trainer = RLTrainer(rl_config())
    exports = []
    monkeypatch.setattr(trainer, "save_hf", lambda out: exports.append(out))
    with pytest.raises(FinalExportError) as err:
        trainer.fit()
    message = str(err.value)
    assert "the disk is full: the export needs about 16.5 MiB and 1.0 MiB are free" in message
    assert "(checked before writing)" in message and "global_step_2" in message
    assert exports == []
    read_manifest(tmp_path / "global_step_2", verify=True)


def test_when_neither_fits_the_error_says_so(rl_config, tmp_path, monkeypatch):
    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", _no_space_safetensors)
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if "global_step_" in str(f):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(FinalExportError) as err:
        RLTrainer(rl_config()).fit()
    message = str(err.value)
    assert "the final export of the actor" in message and "the disk is full" in message
    assert "saving the run's state after step 2 as a checkpoint instead failed too" in message
    assert "no complete checkpoint exists yet" in message
    assert "Neither fits: the state after step 2 is lost" in message
    assert not any("global_step" in p.name for p in tmp_path.iterdir())  # nothing partial


def test_a_real_full_disk_at_the_end(rl_config, tmp_path, monkeypatch):
    """A 256 KiB tmpfs (needs root) for the checkpoint directory: the export (the tiny
    model's weights are 0.5 MB) and then the checkpoint fail with the file system's own
    ENOSPC (the size check is turned off to reach the writers)."""
    disk = tmp_path / "small"
    disk.mkdir()
    if (
        shutil.which("mount") is None
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True
        ).returncode
    ):
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    monkeypatch.setattr(final_export, "estimated_export_bytes", lambda cfg: None)
    try:
        trainer = RLTrainer(
            rl_config(f"trainer.default_local_dir={disk}", f"trainer.log_dir={tmp_path / 'logs'}")
        )
        with pytest.raises(FinalExportError) as err:
            trainer.fit()
        message = str(err.value)
        assert "the disk is full" in message and "Neither fits" in message
        assert sorted(os.listdir(disk)) == [".verl-run.lock"]  # no partial export or save
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


# ---------------------------------------------------------------------- metrics


def test_a_full_disk_while_logging_metrics_warns_once_and_training_goes_on(
    rl_config, tmp_path, monkeypatch, caplog
):
    metrics = tmp_path / "metrics.jsonl"
    real_write = os.write
    failed = []

    def write(fd, data):
        """The metrics file's disk is full for the rows of step 2: 10 bytes fit, then
        ENOSPC (a torn row, unless the tracker cuts it off)."""
        try:
            is_metrics = os.path.samefile(f"/proc/self/fd/{fd}", metrics)
        except OSError:
            is_metrics = False
        data = bytes(data)
        if is_metrics and (data.startswith(b'{"step": 2,') or failed):
            if not failed:
                failed.append(fd)
                return real_write(fd, data[:10])
            failed.clear()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    trainer = RLTrainer(rl_config("trainer.total_training_steps=3"))
    with caplog.at_level(logging.WARNING, logger="verl.trainer.lifecycle.tracking"):
        result = trainer.fit()
    monkeypatch.undo()
    assert len(trainer.history) == 3 and (tmp_path / "huggingface" / "model.safetensors").is_file()
    assert result["hf_dir"] == str(tmp_path / "huggingface")
    warnings = [r.getMessage() for r in caplog.records if "logging to" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"logging to {metrics} failed (the disk is full)" in warnings[0]
    assert "Training continues" in warnings[0]
    assert trainer.tracker.failed_writes == {str(metrics): 1}
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]  # none torn
    assert 2 not in steps and {1, 3} <= set(steps)  # (step 0: the validation before training)
