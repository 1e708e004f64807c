"""The memory model (longca/results/memory_model.py): a + b·n where the peaks are linear, a c·n² term
where they are not, the longest length a GPU holds by it, checked held out and against the measured
limits; on the published H200 table, and drawn in the report."""

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from longca.results import gpus, memory_model, plots, tables

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "docs/results/h200_2026-11-23/kernels.parquet"
LENGTHS = [1024 * 2**i for i in range(8)]


def _rows(peak, status=lambda n: "ok", kernel="k", device="NVIDIA H200"):
    return pd.DataFrame([{"kernel": kernel, "mask": "causal", "direction": "fwd", "dtype": "bfloat16",
                          "device": "cuda", "device_name": device, "seqlen": n, "status": status(n),
                          "peak_mem_bytes": peak(n) if status(n) == "ok" else None} for n in LENGTHS])


def test_a_linear_need_is_fitted_linear_and_its_limit_solved():
    model = memory_model.fit(LENGTHS, [5e7 + 3e4 * n for n in LENGTHS])
    assert model.terms == "a + b·n" and model.c == 0
    assert model.a == pytest.approx(5e7, rel=1e-6) and model.b == pytest.approx(3e4, rel=1e-9)
    assert model.longest(5e7 + 3e4 * 1e6) == pytest.approx(1e6, abs=1)


def test_a_dense_mask_gets_its_quadratic_term():
    model = memory_model.fit(LENGTHS, [1e8 + 2e4 * n + n * n for n in LENGTHS])
    assert model.terms == "a + b·n + c·n²" and model.c == pytest.approx(1.0, rel=1e-6)
    assert model.longest(1e8 + 2e4 * 2**18 + 2**36) == pytest.approx(2**18, abs=1)
    assert memory_model.fit(LENGTHS[:1], [1e8]) is None  # one length fits nothing


def test_limits_hold_out_the_longest_and_bracket_it_with_the_measured_oom():
    memory = gpus.memory_bytes("H200")
    b = memory / 100_000  # the model's limit: ~100K tokens, between 64K (ok) and 128K (oom)
    rows = _rows(lambda n: b * n, status=lambda n: "ok" if n <= 65536 else "oom")
    (limit,) = memory_model.limits(rows).to_dict("records")
    assert limit["longest_ok"] == 65536 and limit["first_oom"] == 131072
    assert 65536 <= limit["predicted_longest"] < 131072 and limit["agrees"] is True
    assert limit["held_out_seqlen"] == 65536 and abs(limit["held_out_error"]) < 1e-9


def test_gpu_models_by_name():
    assert gpus.model_of("NVIDIA H100 80GB HBM3") == "H100" and gpus.model_of("NVIDIA H200") == "H200"
    assert gpus.memory_bytes("h200") == gpus.memory_bytes("NVIDIA H200") == 143771 * 2**20
    assert gpus.memory_bytes("NVIDIA A100") is None


def test_longest_fits_groups_by_what_it_is_asked():
    rows = pd.concat([_rows(lambda n: n * 1e4), _rows(lambda n: n * 1e4, device="NVIDIA H100 80GB HBM3")])
    assert len(tables.longest_fits(rows)) == 1
    by_gpu = tables.longest_fits(rows, by=memory_model.GROUP)
    assert sorted(e["device_name"] for e in by_gpu) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]


def test_the_published_h200_table_is_fitted_within_its_held_out_error():
    limits = memory_model.limits(pd.read_parquet(H200))
    assert len(limits) and limits["held_out_error"].notna().all()
    assert limits["held_out_error"].abs().max() < 0.05
    # SDPA's dense mask (a varlen mask through cuDNN) is quadratic; FlashAttention-3 on it is not.
    by = limits.set_index(["kernel", "mask", "direction"])
    assert by.loc[("sdpa_cudnn", "varlen_causal", "fwd"), "terms"] == "a + b·n + c·n²"
    assert by.loc[("flash_attn3", "varlen_causal", "fwd"), "terms"] == "a + b·n"


def test_the_report_figure_draws_the_model_out_to_the_gpus_memory():
    fig = plots.memory_model_figure(_rows(lambda n: 1e8 + 3e4 * n), "causal")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and max(ax.lines[0].get_xdata()) > LENGTHS[-1]  # out to the limit
    plt.close(fig)
    empty = plots.memory_model_figure(_rows(lambda n: 1.0).assign(device="cpu"), "causal")
    assert "no memory model" in " ".join(t.get_text() for t in empty.texts)
    plt.close(empty)
