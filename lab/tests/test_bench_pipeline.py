"""lab/longca_lab/bench_pipeline.py on the CPU: both sides, the chunks, and the interleaved retest of
the cells outside the fidelity band, through the real Snakemake (the GPU figures come from a box)."""

import json
import shutil
import statistics
import tempfile
from pathlib import Path

import pytest
import yaml
import tiny
from longca_lab import bench_pipeline

REPO = Path(__file__).resolve().parents[2]

TINY = tiny.grid(kernels=["sdpa", "sdpa_math"], seqlens=[64, 128], heads_kv=1, timing={"warmup": 1, "reps": 3},
                 isolation="resident")  # the GPU default, on the CPU lane


def test_next_chunk_prediction_grows_with_the_last_two_chunks():
    assert bench_pipeline.next_chunk_s([]) is None
    assert bench_pipeline.next_chunk_s([10.0]) == pytest.approx(16.0)  # at least GROWTH
    assert bench_pipeline.next_chunk_s([10.0, 30.0]) == pytest.approx(120.0)  # at most MAX_GROWTH
    assert bench_pipeline.next_chunk_s([10.0, 17.0]) == pytest.approx(17.0 * 1.7 ** 2)


@pytest.fixture
def runtime_tmp(monkeypatch):
    """A runtime dir of the test's own for the lanes (short: Unix socket paths are limited)."""
    path = tempfile.mkdtemp(prefix="lc", dir="/tmp")
    monkeypatch.setenv("TMPDIR", path)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def lanes_started(runtime: Path) -> int:
    return len(list(runtime.rglob("*-lane-*.log")))


@pytest.mark.slow
@pytest.mark.parametrize("fresh", [False, True], ids=["one-lane", "fresh-processes"])
def test_every_cell_is_measured_both_ways_and_the_misses_again_interleaved(tmp_path, monkeypatch, runtime_tmp,
                                                                           fresh):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUTE_DSL_CACHE_DIR"):
        monkeypatch.setenv(var, "")  # main() points them at the bench's own caches; restored after
    # A band of zero puts every ok cell outside it, so every one is retested.
    monkeypatch.setattr(bench_pipeline, "FIDELITY", 0.0)
    out, work = tmp_path / "out", tmp_path / "work"
    extra = ["--fresh-processes"] if fresh else []
    assert bench_pipeline.main([str(out), "--budget-s", "900", "--work", str(work), "--configfile", str(config),
                                "--cores", "2", *extra]) == 0
    # The first pass and a plain retest share one lane; fresh processes add one per length and round.
    assert lanes_started(runtime_tmp) == (1 + 2 * 2 if fresh else 1)

    chunks = [json.loads(line) for line in (out / "pipeline_chunks.jsonl").read_text().splitlines()]
    assert [c["seqlen"] for c in chunks] == [64, 128]
    assert [c["first"] for c in chunks] == ["workflow", "bare"]  # alternating
    assert all(c["workflow_exit"] == 0 and c["workflow_s"] > 0 and c["bare_s"] > 0 for c in chunks)

    cells = [json.loads(line) for line in (out / "pipeline_cells.jsonl").read_text().splitlines()]
    assert len(cells) == 2 * 2 * 2
    assert all(c["workflow_status"] == c["bare_status"] == "ok" for c in cells)
    retests = {r["cell"]: r for r in map(json.loads, (out / "pipeline_retests.jsonl").read_text().splitlines())}
    assert set(retests) == {c["cell"] for c in cells}
    for r in retests.values():
        assert r["order"] == ["bare", "workflow", "workflow", "bare"]
        assert r["fresh_processes"] is fresh
        assert len(r["workflow"]) == len(r["bare"]) == len(r["bare_first"]) == 2
    # The first pass's workflow figure is kept although the retest rewrote the cell's file.
    for c in cells:
        row = json.loads((work / f"results/cells/kernels/{c['cell']}.json").read_text())
        assert row["tflops"] == retests[c["cell"]]["workflow"][-1]
        assert c["retest_ratio"] > 0 and c["workflow_tflops"] != row["tflops"]
        r = retests[c["cell"]]
        wf = statistics.median(r["workflow"])
        low, high = sorted((statistics.median(r["bare"]), statistics.median(r["bare_first"])))
        # Zero inside the two bare loops' range, else the distance to its nearer end.
        off = c["retest_off_range"]
        assert off == 0 if low <= wf <= high else off == pytest.approx(wf / (high if wf > high else low) - 1)

    summary = (out / "summary.md").read_text()
    assert "| all | 8 |" in summary
    assert ("retested interleaved (2 per side, each in a fresh process)" if fresh
            else "retested interleaved (2 per side)") in summary
    assert "ok cells within ±0%, first pass or interleaved retest:" in summary
    assert "retested cells within ±0% of the range of the two bare loops:" in summary

    # Running it again continues: nothing is left to measure or retest.
    before = (out / "pipeline_retests.jsonl").read_text()
    assert bench_pipeline.main([str(out), "--budget-s", "900", "--work", str(work), "--configfile", str(config),
                                "--cores", "2", *extra]) == 0
    assert (out / "pipeline_retests.jsonl").read_text() == before


@pytest.mark.slow
def test_named_cells_are_retested_with_the_workflows_timing_in_the_bare_process_too(tmp_path, monkeypatch,
                                                                                    runtime_tmp):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUTE_DSL_CACHE_DIR"):
        monkeypatch.setenv(var, "")
    out, work = tmp_path / "out", tmp_path / "work"
    common = [str(out), "--budget-s", "900", "--work", str(work), "--configfile", str(config), "--cores", "2"]
    # A name that is no cell of the grid stops the run before anything is measured, naming it.
    with pytest.raises(SystemExit, match="sdpa/nosuchmask/float32_fwd_64"):
        bench_pipeline.main([*common, "--retest-cells", "sdpa/full/float32_fwd_64", "sdpa/nosuchmask/float32_fwd_64"])
    assert lanes_started(runtime_tmp) == 0 and not (work / "results").exists()

    named = ["sdpa/full/float32_fwd_64", "sdpa_math/causal/float32_fwd_128"]
    assert bench_pipeline.main([*common, "--retest-cells", *named, "--bare-harness", "--fresh-processes"]) == 0
    assert not (out / "pipeline_chunks.jsonl").read_text()  # no first pass
    assert lanes_started(runtime_tmp) == 2  # a fresh lane per round: named cells go in one group
    retests = {r["cell"]: r for r in map(json.loads, (out / "pipeline_retests.jsonl").read_text().splitlines())}
    assert set(retests) == set(named)
    for r in retests.values():
        assert r["order"] == ["bare", "workflow", "workflow", "bare"]
        assert len(r["workflow"]) == len(r["bare"]) == len(r["bare_first"]) == len(r["bare_harness"]) == 2
        assert all(x > 0 for x in r["bare_harness"])
    summary = (out / "summary.md").read_text()
    for name in named:
        r = retests[name]
        line = next(line for line in summary.splitlines() if line.startswith(f"| {name} |"))
        harness = statistics.median(r["bare_harness"])
        assert f"| {statistics.median(r['workflow']) / harness:.3f} |" in line
        assert f"| {harness / statistics.median(r['bare']):.3f} |" in line
