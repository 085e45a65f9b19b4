"""The machine's calibration line: positive rates, and the line run.sh prints."""

from __future__ import annotations

import re

from verl.utils.calibrate import calibrate, calibration_line


def test_rates_are_measured_and_printed_as_one_line():
    rates = calibrate(size=128, repeats=1)
    assert rates["device"] == "cpu" and int(rates["threads"]) >= 1
    for key in ("fp32_gflops", "bf16_gflops", "mem_gbs"):
        assert 0 < float(rates[key]) < 1e6, (key, rates[key])
    line = calibration_line(rates)
    assert re.fullmatch(
        r"machine: cpu, \d+ threads, bf16 \d+ GFLOP/s, fp32 \d+ GFLOP/s, copy \d+\.\d GB/s", line
    ), line
