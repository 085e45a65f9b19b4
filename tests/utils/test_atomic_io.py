"""verl.utils.atomic_io: the one place files and directories are replaced crash-safely."""

from __future__ import annotations

import json
import math
import threading

import pytest
import torch

from verl.utils.atomic_io import (
    atomic_path,
    publish_dir,
    replace_dir_atomically,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)


def _names(directory):
    return sorted(p.name for p in directory.iterdir())


def test_bytes_text_json_round_trip_and_replace(tmp_path):
    write_bytes_atomic(tmp_path / "b.bin", b"\x00\x01\xff")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01\xff"
    write_text_atomic(tmp_path / "t.txt", "old")
    write_text_atomic(tmp_path / "t.txt", "ñew ✓\n")  # UTF-8 whatever the locale
    assert (tmp_path / "t.txt").read_bytes() == "ñew ✓\n".encode()
    write_json_atomic(tmp_path / "s.json", {"lr": 0.1 + 0.2, "inf": math.inf, "n": [1, 2]})
    back = json.loads((tmp_path / "s.json").read_text())
    assert back["lr"] == 0.1 + 0.2 and back["inf"] == math.inf and back["n"] == [1, 2]
    assert _names(tmp_path) == ["b.bin", "s.json", "t.txt"]  # no temporary left
    write_text_atomic(tmp_path / "sub" / "deeper" / "x.txt", "made parents")
    assert (tmp_path / "sub" / "deeper" / "x.txt").read_text() == "made parents"


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "state.json"
    write_json_atomic(target, {"step": 1})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"step": object()})
    with pytest.raises(RuntimeError, match="disk died"), atomic_path(target) as tmp:
        tmp.write_text('{"step": 2, "half')
        raise RuntimeError("disk died")
    assert json.loads(target.read_text()) == {"step": 1}
    assert _names(tmp_path) == ["state.json"]


def test_atomic_path_serves_writers_that_take_a_path(tmp_path):
    target = tmp_path / "t.pt"
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".t.pt.tmp-")
        torch.save({"w": torch.arange(3)}, tmp)
    assert torch.equal(torch.load(target)["w"], torch.arange(3))
    with pytest.raises(FileNotFoundError, match=r"wrote nothing to .*t\.pt"), atomic_path(target):
        pass
    assert _names(tmp_path) == ["t.pt"]


def test_concurrent_writers_never_share_a_temporary(tmp_path):
    target = tmp_path / "shared.txt"
    texts = [f"writer {i}\n" * 2000 for i in range(8)]
    errors = []

    def write(text):
        try:
            for _ in range(5):
                write_text_atomic(target, text)
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=write, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert target.read_text() in texts  # one whole version, never a mix
    assert _names(tmp_path) == ["shared.txt"]


def test_replace_dir_atomically(tmp_path):
    out = tmp_path / "hf"
    with replace_dir_atomically(out) as tmp:
        (tmp / "config.json").write_text("{}")
    assert _names(out) == ["config.json"]
    with replace_dir_atomically(out) as tmp:
        (tmp / "model.safetensors").write_bytes(b"new")
    assert _names(out) == ["model.safetensors"]  # replaced whole, not merged
    with pytest.raises(OSError, match="full"), replace_dir_atomically(out) as tmp:
        (tmp / "partial").write_bytes(b"x")
        raise OSError("disk full")
    assert _names(out) == ["model.safetensors"]
    assert _names(tmp_path) == ["hf"]


def test_publish_dir_sets_the_old_one_aside_then_deletes_it(tmp_path):
    out, new = tmp_path / "global_step_3", tmp_path / ".new"
    out.mkdir()
    (out / "old").write_text("1")
    new.mkdir()
    (new / "fresh").write_text("2")
    publish_dir(new, out, aside=tmp_path / ".global_step_3.deleting-x")
    assert _names(out) == ["fresh"]
    assert _names(tmp_path) == ["global_step_3"]
