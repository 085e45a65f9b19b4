"""The machine's calibration line: positive rates, and the line run.sh prints."""

from __future__ import annotations

import re

import pytest

from verl.utils import calibrate as calibrate_module
from verl.utils.calibrate import calibrate, calibration_line


def test_rates_are_measured_and_printed_as_one_line():
    rates = calibrate(size=128, repeats=1)
    assert rates["device"] == "cpu" and int(rates["threads"]) >= 1
    for key in ("fp32_gflops", "bf16_gflops", "mem_gbs"):
        assert 0 < float(rates[key]) < 1e6, (key, rates[key])
    line = calibration_line(rates)
    assert re.fullmatch(
        r"machine: cpu, \d+ threads, bf16 \d+ GFLOP/s, fp32 \d+ GFLOP/s, copy \d+\.\d GB/s"
        r"( \(bf16 emulated: auto runs fp32\))?",
        line,
    ), line


@pytest.mark.parametrize("native", [True, False])
def test_the_line_says_when_bf16_is_emulated(monkeypatch, native):
    monkeypatch.setattr(calibrate_module, "cpu_bf16_is_fast_and_correct", lambda: native)
    rates = calibrate(size=128, repeats=1)
    assert rates["bf16_native"] is native
    assert calibration_line(rates).endswith("(bf16 emulated: auto runs fp32)") is not native
