"""Peak at a sampled SM clock: the arithmetic, the clock file, and a row's window."""

import pandas as pd
import pytest

from longca.results import peak

CLOCKS = """timestamp, index, clocks.current.sm [MHz], power.draw [W], temperature.gpu, utilization.gpu [%]
2026/11/29 04:43:15.267, 0, 345 MHz, 79.97 W, 39, 0 %
2026/11/29 04:43:16.000, 0, 1650 MHz, 690.00 W, 60, 100 %
2026/11/29 04:43:16.500, 0, 1710 MHz, 690.00 W, 60, 100 %
2026/11/29 04:43:16.900, 0, 1980 MHz, 120.00 W, 50, 0 %
2026/11/29 04:43:20.000, 0, 1980 MHz, 120.00 W, 50, 0 %
"""


def test_nominal_peaks_are_the_published_ones():
    # H200 at its 1,980 MHz boost: 1,071 bf16 / 2,141 fp8 (cudnn-frontend's benchmark); H100 SXM at
    # 1,830 MHz: 989.4 (NVIDIA's whitepaper).
    assert peak.peak_tflops("NVIDIA H200", "bfloat16", 1980) == pytest.approx(1070.5, abs=0.1)
    assert peak.peak_tflops("NVIDIA H200", "float8_e4m3fn", 1980) == pytest.approx(2141.1, abs=0.1)
    assert peak.peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16", 1830) == pytest.approx(989.4, abs=0.1)
    assert peak.peak_tflops("NVIDIA H100 PCIe", "bfloat16", 1755) < peak.peak_tflops("NVIDIA H100", "bfloat16", 1755)
    assert peak.peak_tflops("NVIDIA A100-SXM4-80GB", "bfloat16", 1410) is None  # unknown: no figure
    assert peak.peak_tflops("NVIDIA H200", "float32", 1980) is None           # TF32 or not: unknown


def test_a_row_is_set_against_the_clock_sampled_while_it_was_timed(tmp_path):
    path = tmp_path / "gpu_clocks.csv"
    path.write_text(CLOCKS)
    clocks = peak.read_clocks(path)
    assert list(clocks["sm_mhz"]) == [345, 1650, 1710, 1980, 1980]
    # Timing ended in [16 s, 17 s) after 0.4 s: the window [15.6, 17] holds 1650 and 1710, not the idle
    # 345 MHz sample before it, nor the idle GPU's 1980 MHz after the call (0 % busy).
    rows = pd.DataFrame([
        {"timed_at": "2026-11-29T04:43:16+00:00", "time_wall_s": 0.4, "device_name": "NVIDIA H200",
         "dtype": "bfloat16", "tflops": 500.0},
        {"timed_at": "2026-11-29T05:00:00+00:00", "time_wall_s": 0.4, "device_name": "NVIDIA H200",
         "dtype": "bfloat16", "tflops": 500.0},   # no sample then
    ])
    out = peak.with_peak_share(rows, clocks)
    assert out["sm_clock_mhz"][0] == 1680.0
    assert out["pct_of_peak"][0] == pytest.approx(100 * 500 / peak.peak_tflops("NVIDIA H200", "bfloat16", 1680))
    assert pd.isna(out["sm_clock_mhz"][1]) and pd.isna(out["pct_of_peak"][1])
