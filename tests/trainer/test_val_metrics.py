"""Validation metrics per data source and per extra_info field (trainer.val_group_by)."""

from __future__ import annotations

import pytest

from verl.trainer.lifecycle.metrics import compute_validation_metrics


def test_split_by_extra_info_field():
    accs = [1.0, 0.0, 1.0, 1.0, 0.0]
    scores = [1.0, 0.0, 0.5, 1.0, 0.0]
    sources = ["arith", "arith", "arith", "gsm8k", "gsm8k"]
    infos = [{"op": "+"}, {"op": "*"}, {"op": "+"}, {"level": 1}, None]
    out = compute_validation_metrics(accs, scores, sources, infos, ["op"])
    assert out["val/acc"] == pytest.approx(0.6)
    assert out["val/acc/arith"] == pytest.approx(2 / 3)
    assert out["val/acc/arith/op=+"] == 1.0 and out["val/score/arith/op=+"] == 0.75
    assert out["val/acc/arith/op=*"] == 0.0
    assert out["val/acc/gsm8k"] == 0.5
    # rows without the field are not in any op split
    assert not [k for k in out if k.startswith("val/acc/gsm8k/")]
    # no grouping asked: only the sources
    plain = compute_validation_metrics(accs, scores, sources, infos)
    assert sorted(k for k in plain if k.startswith("val/acc")) == [
        "val/acc",
        "val/acc/arith",
        "val/acc/gsm8k",
    ]


def test_unknown_field_names_what_exists():
    with pytest.raises(ValueError, match=r"extra_info\['opp'\].*\['level', 'op'\]"):
        compute_validation_metrics([1.0], [1.0], ["a"], [{"op": "+", "level": 2}], ["opp"])
