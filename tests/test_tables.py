"""The tables the report shows (longca.results.tables): winners, status markers, CP efficiency and
the methodology tables, on synthetic rows (report_data) and on small hand-made frames."""

import numpy as np
import pandas as pd
import pytest
import report_data as rd

from longca.results import tables


@pytest.fixture(scope="module")
def kernels():
    return rd.kernels_df()


def _rows(*records, **common) -> pd.DataFrame:
    return pd.DataFrame([{**common, **r} for r in records])


# --- labels and statuses ---------------------------------------------------------------------


def test_seqlen_labels():
    assert [tables.seqlen_label(n) for n in (512, 1024, 32768, 1536, 1000, 2 ** 20)] == \
        ["512", "1K", "32K", "1536", "1000", "1M"]


def test_status_markers_summaries_and_counts():
    assert [tables.status_marker(s) for s in ("unsupported", "oom", "wrong", "error", "timeout", "lost")] == \
        ["X", "E", "W", "!", "T", "?"]
    assert tables.status_summary(["oom", "error", "oom", "oom"]) == "3 oom, 1 error"
    df = _rows({"status": "oom"}, {"status": "ok"}, {"status": "lost"}, {"status": "ok"}, {"status": "unsupported"})
    assert tables.status_counts(df) == [("ok", 2), ("unsupported", 1), ("oom", 1), ("lost", 1)]
    assert tables.status_counts(df, unknown=False) == [("ok", 2), ("unsupported", 1), ("oom", 1)]
    assert tables.status_counts(df.iloc[0:0]) == []


def test_ok_rows_have_status_ok_and_a_number():
    df = _rows({"status": "ok", "tflops": 1.0, "tflops_per_gpu": np.nan},
               {"status": "ok", "tflops": np.nan, "tflops_per_gpu": 2.0},
               {"status": "oom", "tflops": 3.0, "tflops_per_gpu": 3.0})
    assert list(tables.ok_rows(df).index) == [0]
    assert list(tables.ok_rows(df, "tflops_per_gpu").index) == [1]


# --- what a table spans ----------------------------------------------------------------------


def test_directions_dtypes_and_their_combinations():
    df = _rows({"direction": "bwd", "dtype": "float16"}, {"direction": "fwd_bwd", "dtype": "bfloat16"},
               {"direction": "fwd", "dtype": "float16"})
    assert tables.directions(df) == ["fwd", "bwd", "fwd_bwd"]
    assert tables.dtypes(df) == ["bfloat16", "float16"]
    assert tables.combos(df) == [("fwd", "bfloat16"), ("bwd", "bfloat16"), ("fwd_bwd", "bfloat16"),
                                 ("fwd", "float16"), ("bwd", "float16"), ("fwd_bwd", "float16")]
    assert tables.directions(df.iloc[0:0]) == [] and tables.combos(df.iloc[0:0]) == []


def test_mask_order_puts_the_config_order_first():
    df = _rows({"mask": "b"}, {"mask": "c"}, {"mask": "a"}, {"mask": "b"})
    assert tables.mask_order(df, ["a", "zzz", "b"]) == ["a", "b", "c"]
    assert tables.mask_order(df, None) == ["b", "c", "a"]
    assert tables.mask_order(df.iloc[0:0], ["a"]) == []


def test_peak_memory_and_devices():
    gpu = _rows({"peak_mem_bytes": np.nan, "device": "cuda"}, {"peak_mem_bytes": 2.0 ** 20, "device": "cuda"})
    cpu = _rows({"peak_mem_bytes": np.nan, "device": "cpu"}, {"peak_mem_bytes": np.nan, "device": None})
    assert tables.has_peak_memory(gpu) and not tables.has_peak_memory(cpu)
    assert tables.devices_text(cpu) == "cpu"
    assert tables.devices_text(_rows({"device": None})) == "unknown"
    assert tables.devices_text(_rows({"device": "cuda"}, {"device": "cpu"})) == "cpu, cuda"


# --- kernels ---------------------------------------------------------------------------------


def test_best_per_kernel_mask(kernels):
    best = tables.best_per_kernel_mask(kernels).set_index(["direction", "kernel", "mask"])
    assert best.loc[("fwd", "fast_kernel", "causal"), "tflops"] == pytest.approx(2.0)
    assert best.loc[("fwd", "fast_kernel", "causal"), "seqlen"] == 256
    assert best.loc[("fwd", "fast_kernel", "sliding"), "failed"] == "!T"
    assert best.loc[("fwd", "slow_kernel", "causal"), "failed"] == "E"
    assert np.isnan(best.loc[("fwd", "never_kernel", "causal"), "tflops"])
    assert best.loc[("fwd", "never_kernel", "causal"), "failed"] == "X"


def test_best_kernel_notes_lengths_where_nothing_produced_a_number():
    df = rd.kernels_df()
    df.loc[(df["mask"] == "causal") & (df["seqlen"] == 256), "status"] = "oom"
    best = {(e["mask"], e["direction"]): e for e in tables.best_kernels(df)}
    e = best[("causal", "fwd")]
    assert e["kernel"] == "fast_kernel" and e["seqlen"] == 128
    assert e["note"] == "no kernel produced a number above 128 (3 oom)"
    df.loc[df["mask"] == "causal", "status"] = "unsupported"
    e = {(e["mask"], e["direction"]): e for e in tables.best_kernels(df)}[("causal", "fwd")]
    assert e["kernel"] is None and e["note"] == "no kernel produced a number (9 unsupported)"


def test_best_kernel_runner_up_ratio_and_wins_on_a_small_table():
    common = {"mask": "causal", "direction": "fwd", "dtype": "bfloat16"}
    df = _rows({"kernel": "a", "seqlen": 1024, "status": "ok", "tflops": 4.0},
               {"kernel": "b", "seqlen": 1024, "status": "ok", "tflops": 5.0},
               {"kernel": "a", "seqlen": 2048, "status": "ok", "tflops": 6.0},
               {"kernel": "b", "seqlen": 2048, "status": "ok", "tflops": 3.0},
               {"kernel": "a", "seqlen": 4096, "status": "oom", "tflops": np.nan},
               {"kernel": "b", "seqlen": 4096, "status": "timeout", "tflops": np.nan},
               {"mask": "full", "kernel": "a", "seqlen": 1024, "status": "ok", "tflops": 1.0},
               **common)
    df["cell_id"] = [f"{k}/{m}/{s}" for k, m, s in zip(df["kernel"], df["mask"], df["seqlen"])]
    df["tflops_p20"], df["tflops_p80"] = df["tflops"] * 0.9, df["tflops"] * 1.1
    causal, full = tables.best_kernels(df)
    assert causal["kernel"] == "a" and causal["seqlen"] == 2048 and causal["longest_grid"] == 4096
    assert causal["tflops"] == 6.0 and causal["tflops_p20"] == pytest.approx(5.4)
    assert causal["cell_id"] == "a/causal/2048"
    assert (causal["runner_up"], causal["runner_up_tflops"], causal["runner_up_cell_id"]) == ("b", 3.0, "b/causal/2048")
    assert causal["ratio"] == pytest.approx(2.0)
    assert (causal["wins"], causal["lengths"]) == (1, 2)  # b was fastest at 1024
    assert causal["note"] == "no kernel produced a number above 2K (1 oom, 1 timeout)"
    assert full["kernel"] == "a" and "runner_up" not in full and "note" not in full
    assert [e["mask"] for e in tables.best_kernels(df, ["full", "causal"])] == ["full", "causal"]


def _seqlen_frame() -> pd.DataFrame:
    """causal, forward and backward at 1K and 2K:
    1K fwd: a 6.0, b 5.0, c unsupported, d oom;     1K bwd: a 3.0, b 3.0 (a tie), c unsupported, d oom
    2K fwd: b 4.0 only (a oom, c unsupported, d timeout);  2K bwd: a oom, b unsupported, c unsupported."""
    table = {1024: {"fwd": {"a": 6.0, "b": 5.0, "c": "unsupported", "d": "oom"},
                    "bwd": {"a": 3.0, "b": 3.0, "c": "unsupported", "d": "oom"}},
             2048: {"fwd": {"a": "oom", "b": 4.0, "c": "unsupported", "d": "timeout"},
                    "bwd": {"a": "oom", "b": "unsupported", "c": "unsupported"}}}
    records = [{"kernel": k, "seqlen": seqlen, "direction": d,
                **({"status": "ok", "tflops": v} if isinstance(v, float) else {"status": v, "tflops": np.nan})}
               for seqlen, dirs in table.items() for d, cells in dirs.items() for k, v in cells.items()]
    df = _rows(*records, mask="causal", dtype="bfloat16")
    df["cell_id"] = [f"{k}/{d}/{s}" for k, d, s in zip(df["kernel"], df["direction"], df["seqlen"])]
    return df


def test_seqlen_winners_give_the_winner_margin_and_the_x_and_e_names():
    e = {(w["seqlen"], w["direction"]): w for w in tables.seqlen_winners(_seqlen_frame())}
    fwd = e[(1024, "fwd")]
    assert (fwd["kernel"], fwd["tflops"], fwd["cell_id"]) == ("a", 6.0, "a/fwd/1024")
    assert (fwd["runner_up"], fwd["runner_up_tflops"], fwd["tie"]) == ("b", 5.0, False)
    assert fwd["ratio"] == pytest.approx(1.2)
    assert (fwd["unsupported"], fwd["oom"], fwd["failed"]) == (["c"], ["d"], "1 unsupported, 1 oom")
    tie = e[(1024, "bwd")]
    assert tie["tie"] and tie["ratio"] == pytest.approx(1.0) and {tie["kernel"], tie["runner_up"]} == {"a", "b"}
    # The only ok kernel wins without a runner-up; an oom kernel never wins (its tflops is missing).
    only = e[(2048, "fwd")]
    assert (only["kernel"], only["runner_up"], only["ratio"]) == ("b", None, None)
    assert (only["unsupported"], only["oom"]) == (["c"], ["a"])
    assert only["failed"] == "1 oom, 1 unsupported, 1 timeout"
    # Only X / E rows: no winner, and the cell says why.
    none = e[(2048, "bwd")]
    assert none["kernel"] is None and "tflops" not in none and none["runner_up"] is None
    assert (none["unsupported"], none["oom"], none["failed"]) == (["b", "c"], ["a"], "2 unsupported, 1 oom")


def test_a_margin_inside_the_tie_margin_is_a_tie_naming_every_kernel_inside_it():
    df = _seqlen_frame()
    # 1K forward: a 6.0 over b 5.0 is 1.2×: a win at a 10 % margin, a tie at 25 %.
    at = {m: {(w["seqlen"], w["direction"]): w for w in tables.seqlen_winners(df, tie_margin=m)} for m in (0.1, 0.25)}
    assert (at[0.1][(1024, "fwd")]["tie"], at[0.1][(1024, "fwd")]["tied"]) == (False, [])
    assert (at[0.25][(1024, "fwd")]["tie"], at[0.25][(1024, "fwd")]["tied"]) == (True, ["b"])
    assert at[0.1][(1024, "fwd")]["kernel"] == "a"  # still listed first: the larger median
    ranked = pd.DataFrame({"kernel": ["a", "b", "c"], "tflops": [100.0, 96.0, 94.0]})
    assert tables.tied_with(ranked, "tflops", "kernel", 0.05) == ["b"]
    assert tables.tied_with(ranked, "tflops", "kernel", 0.07) == ["b", "c"]


def test_a_row_is_unsteady_when_its_warmup_never_settled_or_its_spread_is_wide():
    steady = pd.Series({"tflops_p20": 100.0, "tflops_p80": 105.0, "warmup_steady": True})
    assert not tables.unsteady(steady)
    assert tables.unsteady(pd.Series({**steady, "tflops_p80": 112.0}))  # p80/p20 1.12
    assert tables.unsteady(pd.Series({"tflops_p20": 100.0, "tflops_p80": 101.0, "warmup_steady": np.False_}))
    assert not tables.unsteady(pd.Series({"tflops_p20": 100.0, "tflops_p80": 101.0, "warmup_steady": None}))


def test_only_ok_rows_win_a_length():
    df = _seqlen_frame()
    df.loc[(df["kernel"] == "a") & (df["seqlen"] == 1024) & (df["direction"] == "fwd"), "status"] = "wrong"
    fwd = {(w["seqlen"], w["direction"]): w for w in tables.seqlen_winners(df)}[(1024, "fwd")]
    assert (fwd["kernel"], fwd["runner_up"]) == ("b", None)  # a's 6.0 failed the gate


def test_seqlen_winner_grid_lays_out_masks_by_lengths():
    df = pd.concat([_seqlen_frame(),
                    _rows({"kernel": "a", "seqlen": 1024, "direction": "fwd", "status": "ok", "tflops": 1.0,
                           "cell_id": "a/full"}, mask="full", dtype="bfloat16")], ignore_index=True)
    grid = tables.seqlen_winner_grid(df, ["full", "causal"])
    assert grid["seqlens"] == [1024, 2048] and grid["directions"] == ["fwd", "bwd"]
    assert [(r["mask"], r["dtype"]) for r in grid["rows"]] == [("full", "bfloat16"), ("causal", "bfloat16")]
    full, causal = grid["rows"]
    assert full["cells"][1] is None  # full was not measured at 2K
    assert full["cells"][0]["entries"]["fwd"]["kernel"] == "a" and full["cells"][0]["entries"]["bwd"] is None
    one, two = causal["cells"]
    assert one["entries"]["fwd"]["kernel"] == "a" and two["entries"]["bwd"]["kernel"] is None
    # X / E names per cell; a name with that status in only some directions says which.
    assert one["unsupported"] == [("c", [])] and one["oom"] == [("d", [])]
    assert two["unsupported"] == [("b", ["bwd"]), ("c", [])] and two["oom"] == [("a", [])]
    # Without a's backward row at 2K, its forward oom is no "forward only" E: only a measured direction counts.
    partial = df[~((df["kernel"] == "a") & (df["seqlen"] == 2048) & (df["direction"] == "bwd"))]
    assert tables.seqlen_winner_grid(partial)["rows"][0]["cells"][1]["oom"] == [("a", [])]
    assert tables.seqlen_winner_grid(df.iloc[0:0]) == {"seqlens": [], "directions": [], "rows": []}


def test_methodology_tables_on_a_small_table():
    df = _rows({"mask": "m2", "pattern": "p", "seqlen": 128, "area": 10, "density": 0.5, "mask_params_resolved": "{}",
                "direction": "bwd", "dtype": "float16", "gate_tolerance": 0.04, "gate_seqlen": 64.0},
               {"mask": "m1", "pattern": "p", "seqlen": 256, "area": 20, "density": 0.25, "mask_params_resolved": "{}",
                "direction": "fwd", "dtype": "float16", "gate_tolerance": 0.02, "gate_seqlen": np.nan},
               {"mask": "m1", "pattern": "p", "seqlen": 256, "area": 20, "density": 0.25, "mask_params_resolved": "{}",
                "direction": "fwd", "dtype": "float16", "gate_tolerance": np.nan, "gate_seqlen": 32.0},
               batch=1, heads_q=4, heads_kv=2, head_dim=16)
    df.loc[2, "heads_q"] = 8
    areas = tables.mask_areas(df)
    assert list(areas.columns) == ["mask", "pattern", "seqlen", "area", "density", "mask_params_resolved"]
    assert list(zip(areas["mask"], areas["seqlen"], areas["area"])) == [("m1", 256, 20), ("m2", 128, 10)]
    tol = tables.gate_tolerances(df)
    assert list(zip(tol["direction"], tol["gate_tolerance"])) == [("bwd", 0.04), ("fwd", 0.02)]
    assert tables.problem_shapes(df) == [{"batch": 1, "heads_q": 4, "heads_kv": 2, "head_dim": 16},
                                         {"batch": 1, "heads_q": 8, "heads_kv": 2, "head_dim": 16}]
    assert tables.gate_seqlens(df) == [32, 64]
    empty = df.iloc[0:0]
    assert tables.mask_areas(empty).empty and tables.problem_shapes(empty) == [] and tables.gate_seqlens(empty) == []
    assert list(tables.gate_tolerances(empty).columns) == ["direction", "dtype", "gate_tolerance"]


def test_timing_settings():
    df = _rows({"warmup": 2, "warmup_ms": np.nan, "reps": 5}, {"warmup": 2, "warmup_ms": 25.0, "reps": 5},
               {"warmup": 2, "warmup_ms": np.nan, "reps": 5}, {"warmup": np.nan, "warmup_ms": 1.0, "reps": 5})
    assert tables.timing_settings(df) == [(2, 0.0, 5), (2, 25.0, 5)]
    assert tables.timing_settings(df.drop(columns="warmup_ms")) == [(2, 0.0, 5)]
    assert tables.timing_settings(df.drop(columns="warmup")) == []


# --- context parallelism ---------------------------------------------------------------------


def test_cp_scaling_is_against_the_same_strategy_at_cp_size_one(kernels):
    eff = tables.cp_efficiency(rd.cp_df(), kernels).set_index("cell_id")
    ring = eff.loc["ring/causal/bfloat16_fwd_64x2"]
    assert ring["tokens_per_rank"] == 64 and ring["seqlen"] == 128
    assert ring["scaling"] == pytest.approx(0.9)          # 0.45 per GPU against its cp_size-1 0.5
    assert eff.loc["ulysses/causal/bfloat16_bwd_64x4", "scaling"] == pytest.approx(0.7)
    assert eff.loc["ring/causal/bfloat16_fwd_64x1", "scaling"] == pytest.approx(1.0)
    oom = eff.loc["ulysses/causal/bfloat16_fwd_128x4"]
    assert np.isnan(oom["scaling"]) and oom["scaling_note"] == "the CP cell is oom"
    # Another local kernel at cp_size 1 is another comparison: none.
    cp = rd.cp_df()
    cp.loc[cp["cp_size"] == 1, "local_kernel"] = "slow_kernel"
    again = tables.cp_efficiency(cp, kernels).set_index("cell_id").loc["ring/causal/bfloat16_fwd_64x2"]
    assert np.isnan(again["scaling"]) and again["scaling_note"].startswith("no cp_size-1 cell")


def test_cp_vs_one_gpu_is_against_the_fastest_kernel_on_the_same_total_problem(kernels):
    eff = tables.cp_efficiency(rd.cp_df(), kernels).set_index("cell_id")
    ring = eff.loc["ring/causal/bfloat16_fwd_64x2"]
    # seqlen 128: fast_kernel (1.0 TFLOPs/s) beats slow_kernel (0.5); ring reaches 0.45 per GPU.
    assert (ring["one_gpu_kernel"], ring["one_gpu_tflops"]) == ("fast_kernel", pytest.approx(1.0))
    assert ring["vs_one_gpu"] == pytest.approx(0.45) and ring["one_gpu_cell_id"] == "fast_kernel/causal/bfloat16_fwd_128"
    # seqlen 512 (128 tokens × 4): no kernel cell that long.
    far = eff.loc["ring/causal/bfloat16_fwd_128x4"]
    assert np.isnan(far["vs_one_gpu"]) and far["one_gpu_note"].startswith("no single-GPU kernel cell at 512 tokens")


def test_cp_efficiency_says_why_a_comparison_is_missing(kernels):
    cp = rd.cp_df(with_tokens_per_rank=False)  # tokens per rank derived: seqlen // cp_size
    assert "tokens_per_rank" not in cp.columns or cp["tokens_per_rank"].isna().all()
    cp.loc[0, "mask"] = "no_such_mask"  # no kernel cell for it
    k = kernels.copy()
    k.loc[(k["seqlen"] == 128) & (k["mask"] == "causal") & (k["direction"] == "bwd"), "status"] = "unsupported"
    eff = tables.cp_efficiency(cp, k).set_index("cell_id")
    first = eff.iloc[0]
    assert first["tokens_per_rank"] == 64 and np.isnan(first["vs_one_gpu"])
    assert first["one_gpu_note"].startswith("no single-GPU kernel cell at 64 tokens")
    assert eff.loc["ring/causal/bfloat16_bwd_64x2", "one_gpu_note"] == "no single-GPU kernel ran ok at 128 tokens"


def test_cp_efficiency_matches_rows_whose_shapes_were_not_recorded(kernels):
    # Missing values (NaN in pandas) on both sides still name the same problem.
    k, cp = kernels.copy(), rd.cp_df()
    for col in ("batch", "heads_q", "heads_kv", "head_dim"):
        k[col], cp[col] = np.nan, np.nan
    eff = tables.cp_efficiency(cp, k).set_index("cell_id")
    assert eff.loc["ring/causal/bfloat16_fwd_64x2", "vs_one_gpu"] == pytest.approx(0.45)
    # A recorded shape that differs is another problem: no comparison.
    cp["heads_q"] = 8
    assert tables.cp_efficiency(cp, k)["vs_one_gpu"].isna().all()


def test_cp_efficiency_of_an_empty_table_is_empty(kernels):
    assert tables.cp_efficiency(rd.empty_cp_df(), kernels).empty


def test_tokens_per_rank_recorded_or_derived():
    cp = pd.DataFrame({"seqlen": [1024, 4096], "cp_size": [2, 4],
                       "tokens_per_rank": pd.array([100, None], dtype="Int64")})
    assert list(tables.tokens_per_rank(cp)) == [100, 1024]
    assert list(tables.tokens_per_rank(cp.drop(columns="tokens_per_rank"))) == [512, 1024]
    assert tables.tokens_per_rank(cp.iloc[0:0]).empty


def test_rank_imbalance_and_the_cp_table(kernels):
    imb = tables.rank_imbalance([[1, 1, 1, 1], [3, 1], np.array([2, 2]), [], [0, 0], None])
    assert imb[:3] == [1.0, 1.5, 1.0] and all(np.isnan(v) for v in imb[3:])
    table = tables.cp_table(rd.cp_df(), kernels)
    assert {"scaling", "vs_one_gpu", "one_gpu_note", "imbalance"} <= set(table.columns)
    # rank_area [1000, 1010] on cp_size 2: max / mean = 1010 / 1005
    assert table.loc[table["cp_size"] == 2, "imbalance"].iloc[0] == pytest.approx(1010 / 1005)
    empty = tables.cp_table(None, kernels)
    assert empty.empty and "vs_one_gpu" in empty.columns and "strategy" in empty.columns


def test_best_strategies_on_a_small_table():
    common = {"mask": "causal", "direction": "fwd", "dtype": "bfloat16", "local_kernel": "k", "cp_size": 2}
    cp = _rows({"strategy": "ring", "seqlen": 2048, "status": "ok", "tflops_per_gpu": 1.0, "vs_one_gpu": 0.5},
               {"strategy": "a2a", "seqlen": 2048, "status": "ok", "tflops_per_gpu": 1.5, "vs_one_gpu": np.nan},
               {"strategy": "ring", "seqlen": 4096, "status": "oom", "tflops_per_gpu": np.nan, "vs_one_gpu": np.nan},
               {"strategy": "ring", "seqlen": 1024, "status": "error", "tflops_per_gpu": np.nan, "vs_one_gpu": np.nan,
                "cp_size": 4, "mask": "full"},
               **common)
    cp["cell_id"] = [f"c{i}" for i in range(len(cp))]
    cp["tokens_per_rank"] = cp["seqlen"] // cp["cp_size"]
    cp["one_gpu_note"] = [None, "no single-GPU k cell", None, None]
    cp["scaling"], cp["one_gpu_kernel"] = np.nan, None
    full, causal = tables.best_strategies(cp, ["full", "causal"])
    assert full["strategy"] is None and full["note"] == "no strategy produced a number (1 error)"
    assert (causal["strategy"], causal["seqlen"], causal["tokens_per_rank"]) == ("a2a", 2048, 1024)
    assert causal["tflops_per_gpu"] == 1.5 and np.isnan(causal["vs_one_gpu"])
    assert causal["one_gpu_note"] == "no single-GPU k cell" and causal["cell_id"] == "c1"
    assert (causal["runner_up"], causal["runner_up_tflops"]) == ("ring", 1.0)
    assert causal["note"] == "no strategy produced a number above 2K (1 oom)"
    assert tables.best_strategies(cp.iloc[0:0]) == []


# --- both ------------------------------------------------------------------------------------


def test_answer_grid_lays_entries_out_as_rows_by_columns():
    entries = [{"mask": "a", "direction": "fwd", "dtype": "bf16", "v": 1},
               {"mask": "b", "direction": "bwd", "dtype": "bf16", "v": 2},
               {"mask": "a", "direction": "bwd", "dtype": "bf16", "v": 3}]
    grid = tables.answer_grid(entries, ["mask"], [("fwd", "bf16"), ("bwd", "bf16")])
    assert [r["key"] for r in grid] == [{"mask": "a"}, {"mask": "b"}]
    assert [[c and c["v"] for c in r["cells"]] for r in grid] == [[1, 3], [None, 2]]


def test_failed_cells_list_kernel_and_cp_cells_with_their_log():
    k = _rows({"cell_id": "k/ok", "status": "ok", "reason": None},
              {"cell_id": "k/oom", "status": "oom", "reason": "out of memory"})
    cp = _rows({"cell_id": "ring/x", "status": "timeout", "reason": "ran past 2 s"})
    assert tables.failed_cells(k, cp) == [
        {"kind": "kernel", "cell_id": "k/oom", "status": "oom", "marker": "E", "reason": "out of memory",
         "log": "results/logs/kernels/k/oom.log"},
        {"kind": "cp", "cell_id": "ring/x", "status": "timeout", "marker": "T", "reason": "ran past 2 s",
         "log": "results/logs/cp/ring/x.log"}]
    assert tables.failed_cells(k.iloc[0:0], cp.iloc[0:0]) == []


def test_distinct_counts_leave_out_what_nothing_recorded():
    df = _rows({"device": "cuda", "slot": None, "host": "h1"}, {"device": "cuda", "slot": None, "host": "h1"},
               {"device": "cpu", "slot": None, "host": "h2"})
    text = lambda v: "" if v is None else str(v)  # noqa: E731
    counts = tables.distinct_counts(df, [("device", "device", text), ("slot", "GPU slot", text),
                                         ("host", "host", text), ("absent", "absent", text)])
    assert list(counts.columns) == ["device", "host", "cells"]
    assert counts.values.tolist() == [["cpu", "h2", 1], ["cuda", "h1", 2]]
    assert tables.distinct_counts(df, [("slot", "GPU slot", text)]).empty
    assert tables.distinct_counts(df.iloc[0:0], [("device", "device", text)]).empty


# --- two machines side by side ---------------------------------------------------------------


def _cells(*records):
    shape = {"dtype": "bfloat16", "batch": 1, "heads_q": 8, "heads_kv": 2, "head_dim": 64, "status": "ok"}
    return pd.DataFrame([{**shape, **dict(zip(["kernel", "mask", "seqlen", "direction", "tflops"], r))} for r in records])


def test_device_ratios_pair_cells_ok_on_both_and_refuse_different_shapes():
    a = _cells(("k1", "causal", 1024, "fwd", 100.0), ("k2", "causal", 1024, "fwd", 50.0),
               ("k1", "full", 1024, "fwd", 80.0))
    b = _cells(("k1", "causal", 1024, "fwd", 110.0), ("k2", "causal", 1024, "fwd", 45.0),
               ("k1", "full", 1024, "bwd", 70.0))  # a full bwd cell a does not have: unmatched
    b.loc[1, "status"] = "oom"  # k2 ran out of memory on b: no ratio for it
    pairs = tables.device_ratios(a, b)
    assert pairs[["kernel", "mask", "ratio"]].values.tolist() == [["k1", "causal", pytest.approx(1.1)]]
    with pytest.raises(ValueError, match="heads_q"):
        tables.device_ratios(a, b.assign(heads_q=16))


def test_best_kernel_ratios_compare_the_fastest_kernel_among_those_both_measured():
    a = _cells(("k1", "causal", 1024, "fwd", 100.0), ("k2", "causal", 1024, "fwd", 90.0),
               ("k3", "causal", 1024, "fwd", 500.0))  # k3 only on a: it must not set a's best
    b = _cells(("k1", "causal", 1024, "fwd", 95.0), ("k2", "causal", 1024, "fwd", 120.0),
               ("k1", "causal", 2048, "fwd", 10.0))  # no 2K cell on a
    best = tables.best_kernel_ratios(tables.device_ratios(a, b))
    assert len(best) == 1
    row = best.iloc[0]
    assert (row["kernel_a"], row["tflops_a"], row["kernel_b"], row["tflops_b"]) == ("k1", 100.0, "k2", 120.0)
    assert row["ratio"] == pytest.approx(1.2) and row["kernels"] == 2
    assert tables.best_kernel_ratios(tables.device_ratios(a, b.iloc[0:0])).empty


# --- what measuring cost ------------------------------------------------------------------------


def test_gpu_work_is_an_ok_cells_warm_up_and_timed_calls():
    rows = _rows({"status": "ok", "warmup_spent_ms": 25.0, "reps": 10, "median_ms": 10.0},
                 {"status": "unsupported", "warmup_spent_ms": None, "reps": None, "median_ms": None})
    assert tables.gpu_work_s(rows).tolist() == [0.125, 0.0]


def test_the_cost_note_counts_only_rows_measured_whole():
    whole = {"parts_reused": None, "time_wall_s": 0.2}
    rows = _rows({**whole, "status": "ok", "wall_s": 0.3, "warmup_spent_ms": 25.0, "reps": 10, "median_ms": 10.0},
                 {**whole, "status": "ok", "wall_s": 0.5, "warmup_spent_ms": 75.0, "reps": 10, "median_ms": 10.0},
                 {**whole, "status": "unsupported", "wall_s": 0.1, "time_wall_s": None},
                 {"parts_reused": "gate,time", "time_wall_s": None, "status": "ok", "wall_s": 0.05,
                  "warmup_spent_ms": 25.0, "reps": 10, "median_ms": 10.0},
                 {"parts_reused": None, "time_wall_s": None, "status": "ok", "wall_s": 9.0,  # before part walls
                  "warmup_spent_ms": 25.0, "reps": 10, "median_ms": 10.0})
    assert tables.measured_whole(rows).tolist() == [True, True, True, False, False]
    rows = rows.assign(device="cuda")
    note = tables.cost_note(rows)
    assert "3 cells were measured whole (2 ok), 0.30 s of wall a cell on average, 1 s in all (3.00× their GPU " \
           "work)" in note and "(0.15 s on average)" in note and "recorded each part's wall): 2." in note
    assert note in tables.provenance_notes(rows.assign(device_name="GPU", kernel="k", dtype="bfloat16"))
    cpu = tables.cost_note(rows.assign(device="cpu"))  # a CPU run did no GPU work
    assert "GPU" not in cpu and "(3.00× their timed CPU work)" in cpu
    assert tables.cost_note(rows.iloc[2:]) is None  # no ok row measured whole


def test_one_tie_rule_within_the_margin_times_the_value():
    """Tied: value × (1 + margin) ≥ best (×1.05 at 0.05), on numbers and element-wise."""
    assert tables.tied_with_best(100.0, 105.0, 0.05) and tables.tied_with_best(105.0, 105.0, 0.0)
    assert not tables.tied_with_best(95.2, 100.0, 0.05)  # ≥ 0.95 × best, but 95.2 × 1.05 < 100
    assert list(tables.tied_with_best(pd.Series([90.0, 96.0, 100.0]), 100.0, 0.05)) == [False, True, True]
