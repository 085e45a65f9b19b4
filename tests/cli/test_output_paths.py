"""`verl generate -o` and `verl eval --json`: an unusable output path is refused before any
model loads, and a write that fails (a full disk) leaves no half-written file."""

from __future__ import annotations

import errno
import json
import os

import pytest

from verl import cli
from verl.utils import writable
from verl.utils.writable import OutputPathError, check_output_file

ROWS = [
    {
        "data_source": "a",
        "responses": ["1", "2"],
        "scores": [1.0, 0.0],
        "accs": [1.0, 0.0],
    }
]


@pytest.fixture
def no_generation(monkeypatch):
    """Fail the test if the model is loaded (generate_rows is where it loads)."""

    def refuse(*args, **kwargs):
        raise AssertionError("generate_rows ran: the output path was not checked first")

    monkeypatch.setattr("verl.trainer.rl.generation.generate_rows", refuse)


@pytest.fixture
def fake_generation(monkeypatch):
    """generate_rows returns ROWS at once (no model)."""
    monkeypatch.setattr("verl.trainer.rl.generation.generate_rows", lambda *a, **k: list(ROWS))


def _half_write(target) -> None:
    """Write a few bytes to ``target``, then fail as a full disk does."""
    with open(target, "wb") as f:
        f.write(b"PAR1 half")
    raise OSError(errno.ENOSPC, "No space left on device")


def test_check_output_file(tmp_path, monkeypatch):
    assert check_output_file(tmp_path / "new" / "deeper" / "o.parquet") == (
        tmp_path / "new" / "deeper" / "o.parquet"
    )
    assert not (tmp_path / "new").exists()  # the check creates nothing
    with pytest.raises(OutputPathError, match="is a directory"):
        check_output_file(tmp_path, "--out")
    ro = tmp_path / "ro.parquet"
    ro.write_text("keep")
    ro.chmod(0o444)
    with pytest.raises(OutputPathError, match=r"--out '.*ro.parquet' is read-only"):
        check_output_file(ro, "--out")
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(OutputPathError, match=r"cannot create its directory, .* is a file"):
        check_output_file(afile / "sub" / "o.parquet", "--out")

    # a read-only filesystem (simulated: root may write anywhere on this machine)
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(writable.tempfile, "mkstemp", read_only)
    with pytest.raises(OutputPathError, match=r"cannot write in .*\(Read-only file system\)"):
        check_output_file(tmp_path / "o.parquet", "--out")
    assert not [n for n in os.listdir(tmp_path) if ".probe-" in n]


def test_generate_refuses_an_unusable_out_before_loading_the_model(
    arith_file, tmp_path, capsys, no_generation
):
    base = ["generate", "--model", str(tmp_path / "no-model"), "--data", str(arith_file)]
    outdir = tmp_path / "out.parquet"
    outdir.mkdir()
    assert cli.main([*base, "-o", str(outdir)]) == 2
    assert f"--out {str(outdir)!r} is a directory" in capsys.readouterr().err
    ro = tmp_path / "ro.jsonl"
    ro.write_text("old\n")
    ro.chmod(0o444)
    assert cli.main([*base, "-o", str(ro)]) == 2
    assert "is read-only" in capsys.readouterr().err
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    assert cli.main([*base, "-o", str(blocker / "o.parquet")]) == 2
    assert "cannot create its directory" in capsys.readouterr().err


def test_generate_full_disk_leaves_no_half_written_file(
    arith_file, tmp_path, capsys, monkeypatch, fake_generation
):
    monkeypatch.setattr("verl.cli.generate.load_rollout_config", lambda args, parser: _cfg())
    monkeypatch.setattr("pyarrow.parquet.write_table", lambda table, where, **k: _half_write(where))
    out = tmp_path / "gens.parquet"
    args = ["generate", "--data", str(arith_file), "-o", str(out)]
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert f"cannot write --out {str(out)!r}: No space left on device" in err
    assert "nothing was written" in err
    assert os.listdir(tmp_path) == []  # no file, no temporary left behind
    out.write_bytes(b"previous")
    assert cli.main(args) == 1
    assert out.read_bytes() == b"previous"  # an existing file is left as it was
    assert os.listdir(tmp_path) == ["gens.parquet"]


def test_eval_json_checked_first_and_written_atomically(tmp_path, capsys, monkeypatch):
    gens = tmp_path / "gens.jsonl"
    gens.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    calls = []
    monkeypatch.setattr(
        "verl.trainer.rl.evaluation.read_generations", lambda path: calls.append(path) or ROWS
    )
    outdir = tmp_path / "m.json"
    outdir.mkdir()
    assert cli.main(["eval", "--generations", str(gens), "--json", str(outdir)]) == 2
    assert f"--json {str(outdir)!r} is a directory" in capsys.readouterr().err
    assert calls == []  # refused before reading or scoring anything
    out = tmp_path / "metrics.json"
    out.write_text("previous")
    monkeypatch.setattr("pathlib.Path.write_bytes", lambda self, data: _half_write(self))
    assert cli.main(["eval", "--generations", str(gens), "--json", str(out)]) == 1
    captured = capsys.readouterr()
    assert "overall" in captured.out  # the table was printed before the write failed
    assert f"cannot write --json {str(out)!r}: No space left on device" in captured.err
    assert out.read_text() == "previous"
    assert sorted(os.listdir(tmp_path)) == ["gens.jsonl", "m.json", "metrics.json"]


def _cfg():
    from verl.config import load_config

    return load_config(None, ["actor_rollout_ref.rollout.n=2"])
