"""scripts/longest_fits.py: the model fitted on the short rows, checked on the long ones held out."""

import pandas as pd

import longest_fits

GIB = 2 ** 30


def _row(kernel, n, peak, status="ok"):
    return {"kernel": kernel, "mask": "causal", "direction": "bwd", "dtype": "bfloat16", "device": "cuda",
            "device_name": "NVIDIA H200", "seqlen": n, "status": status,
            "peak_mem_bytes": peak if status == "ok" else None}


def test_a_long_row_held_out_of_the_fit_gives_the_error_and_a_short_only_group_is_not_listed():
    lengths = [8192, 16384, 32768, 65536, 131072]
    linear = [_row("linear", n, 1 * GIB + 64 * n) for n in lengths] + [_row("linear", 524288, 1 * GIB + 64 * 524288)]
    # Its workspace doubles past 128K: the short rows' model misses the long row by -~47 %.
    jumps = [_row("jumps", n, 1 * GIB + 64 * n) for n in lengths] + [_row("jumps", 524288, 2 * (1 * GIB + 64 * 524288))]
    short = [_row("short", n, 1 * GIB + 64 * n) for n in lengths]
    out = {e["kernel"]: e for e in longest_fits.rows(pd.DataFrame(linear + jumps + short), 131072, None)}
    assert set(out) == {"linear", "jumps"}  # nothing past 128K: nothing held out
    assert abs(out["linear"]["error"]) < 1e-9
    assert out["jumps"]["error"] < -0.45
    assert "-50.0 %" in longest_fits.markdown([out["jumps"]])
