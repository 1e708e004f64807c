"""scripts/restore_cells.py: an archive's cells back into a run directory, only where they are what
the code and config at hand would measure; with the real git, Snakemake and files.

The archive is made by a real run of this checkout's code, so ``--measured-at HEAD`` holds when the
measurement code has no uncommitted edits (as in CI's clean clone)."""

import io
import json
import subprocess
import sys
import tarfile

import pytest
from snakemake_run import REPO, cell_files, planned_cells, snakemake, write_config
import tiny

CONFIG = tiny.grid()
CELLS = {f"results/cells/kernels/sdpa/{m}/float32_fwd_64.json" for m in ("full", "causal")}
HEAD = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    run = tmp_path_factory.mktemp("measured")
    write_config(run, CONFIG)
    proc = snakemake(run, *sorted(CELLS))
    assert proc.returncode == 0, proc.stderr[-4000:]
    path = run / "cells.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for cell in sorted(CELLS):
            tar.add(run / cell, arcname=cell)
    return path


def _restore(archive, workdir, *extra):
    """The run directory named relative to where the command runs, as in docs/results/README.md."""
    config = workdir / "config.yaml"
    return subprocess.run([sys.executable, str(REPO / "scripts" / "restore_cells.py"), str(archive), workdir.name,
                           "--measured-at", HEAD, "--config", str(config), *extra],
                          capture_output=True, text=True, timeout=600, cwd=workdir.parent)


@pytest.mark.slow
def test_restored_cells_are_not_measured_again_and_rerun_when_their_settings_change(archive, tmp_path):
    work = tmp_path / "run"
    write_config(work, CONFIG)
    proc = _restore(archive, work, "--measured-with", str(work / "config.yaml"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 of 2 cells restored whole" in proc.stdout
    assert set(cell_files(work)) == CELLS
    assert not (work / work.name).exists()  # Snakemake's record is the run directory's, not a nested one's
    with tarfile.open(archive) as tar:
        for cell in CELLS:
            assert json.loads((work / cell).read_text()) == json.load(tar.extractfile(cell))
    assert planned_cells(work) == set()  # Snakemake has its record of them: nothing to measure
    write_config(work, {**CONFIG, "seed": 5})
    assert planned_cells(work) == CELLS  # and a changed setting reruns them as usual
    assert snakemake(work, "all").returncode == 0  # the report builds from restored rows too


def _tampered(archive, tmp_path, cell, **changes):
    out = tmp_path / "tampered.tgz"
    with tarfile.open(archive) as src, tarfile.open(out, "w:gz") as dst:
        for member in src.getmembers():
            row = json.load(src.extractfile(member))
            data = json.dumps({**row, **changes} if member.name == cell else row).encode()
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    return out


@pytest.mark.slow
def test_cells_of_other_code_or_settings_are_dropped_and_say_why(archive, tmp_path):
    work = tmp_path / "run"
    write_config(work, CONFIG)
    measured_with = tmp_path / "measured_with.yaml"
    write_config(tmp_path, CONFIG)
    (tmp_path / "config.yaml").rename(measured_with)
    full = "results/cells/kernels/sdpa/full/float32_fwd_64.json"

    other_code = _tampered(archive, tmp_path, full, fingerprint="f" * 16)
    proc = _restore(other_code, work, "--measured-with", str(measured_with), "--dry-run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 of 2 cells restored whole" in proc.stdout and f"dropped 1: not measured at {HEAD}" in proc.stdout
    assert cell_files(work) == {}  # a dry run writes nothing

    write_config(work, {**CONFIG, "timing": {"warmup": 1, "reps": 3}})  # 2 timed calls made, 3 asked now
    proc = _restore(archive, work, "--measured-with", str(measured_with))
    assert "0 of 2 cells restored whole" in proc.stdout and "dropped 2: settings differ (reps)" in proc.stdout
    write_config(work, {**CONFIG, "seed": 7})
    proc = _restore(archive, work, "--measured-with", str(measured_with))
    assert "0 of 2 cells restored whole" in proc.stdout and "dropped 2: settings differ (seed)" in proc.stdout
    assert cell_files(work) == {}


@pytest.mark.slow
def test_a_row_without_a_memory_part_is_completed_by_the_run_on_its_restored_timing(archive, tmp_path):
    """A row measured before the memory part existed: its gate and timing go to the store, and the
    run measures only its memory (the republication of a table on its existing timings)."""
    work = tmp_path / "run"
    write_config(work, CONFIG)
    full = "results/cells/kernels/sdpa/full/float32_fwd_64.json"
    with tarfile.open(archive) as tar:
        was = json.load(tar.extractfile(full))
    old_row = {k: v for k, v in was.items() if k != "parts_reused"}
    older = _tampered(archive, tmp_path, full)
    with tarfile.open(older) as src, tarfile.open(tmp_path / "older.tgz", "w:gz") as dst:
        for member in src.getmembers():
            data = json.dumps(old_row if member.name == full else json.load(src.extractfile(member))).encode()
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    proc = _restore(tmp_path / "older.tgz", work, "--measured-with", str(work / "config.yaml"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 of 2 cells restored whole" in proc.stdout and "gate 2, memory 1, time 2" in proc.stdout
    assert planned_cells(work) == {full}
    assert snakemake(work, "all").returncode == 0
    row = json.loads((work / full).read_text())
    assert row["status"] == "ok" and row["parts_reused"] == "gate,time"
    assert row["median_ms"] == was["median_ms"] and row["gate_error"] == was["gate_error"]


@pytest.mark.slow
def test_a_kernel_the_archived_machine_could_not_run_is_measured_again(archive, tmp_path):
    """`unsupported` because the library was missing there says nothing of the problem: a machine
    that has it must measure the cell, not inherit the row."""
    work = tmp_path / "run"
    write_config(work, CONFIG)
    full = "results/cells/kernels/sdpa/full/float32_fwd_64.json"
    missing = _tampered(archive, tmp_path, full, status="unsupported",
                        reason="sdpa is not importable (ModuleNotFoundError: No module named 'x'); install x")
    proc = _restore(missing, work, "--measured-with", str(work / "config.yaml"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 of 2 cells restored whole" in proc.stdout
    assert "dropped 1: sdpa: unavailable on the machine that ran it" in proc.stdout
    assert planned_cells(work) == {full}
    again = tmp_path / "again"
    write_config(again, CONFIG)
    proc = _restore(missing, again, "--measured-with", str(again / "config.yaml"), "--unavailable-here", "sdpa")
    assert "2 of 2 cells restored whole" in proc.stdout  # the run's machine lacks it too: kept as it was


@pytest.mark.slow
def test_a_kernel_whose_library_changed_is_measured_again(archive, tmp_path):
    """A cache key covers LongCA's code, not the kernel library's: rows of a rebuilt library (same
    version, other code) are named with --library-changed and measured again, nothing of them kept."""
    work = tmp_path / "run"
    write_config(work, CONFIG)
    proc = _restore(archive, work, "--measured-with", str(work / "config.yaml"), "--library-changed", "sdpa")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "0 of 2 cells restored whole" in proc.stdout and "parts put in the store: none" in proc.stdout
    assert "dropped 2: sdpa: its library changed since: measured again" in proc.stdout
    assert planned_cells(work) == CELLS


def test_an_unknown_kernel_named_to_restore_is_an_error_before_any_work(archive, tmp_path):
    work = tmp_path / "run"
    write_config(work, CONFIG)
    proc = _restore(archive, work, "--measured-with", str(work / "config.yaml"), "--library-changed", "nope")
    assert proc.returncode == 2 and "unknown kernel nope; known:" in proc.stderr
    assert not (work / "results").exists()


def test_every_adapter_words_an_unavailable_kernel_as_restore_expects():
    """restore_cells.UNAVAILABLE must recognise what each adapter says on a machine that lacks it
    (this CPU machine lacks every GPU library and the GPU)."""
    import restore_cells

    from longca import kernels

    said = {name: kernels.get(name).available() for name in kernels.names()}
    unavailable = {name: reason for name, reason in said.items() if reason}
    if not unavailable:
        pytest.skip("every kernel runs on this machine: nothing to recognise")
    for name, reason in unavailable.items():
        assert any(words in reason for words in restore_cells.UNAVAILABLE), (name, reason)


def test_a_missing_archive_is_named(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "restore_cells.py"), str(tmp_path / "no.tgz"),
                           str(tmp_path / "run"), "--measured-at", "HEAD", "--config", "x.yaml", "--measured-with",
                           "x.yaml"], capture_output=True, text=True)
    assert proc.returncode == 2 and "no.tgz: no such archive" in proc.stderr


def test_a_restored_part_keeps_the_provenance_its_row_recorded_and_invents_none():
    from restore_cells import part_values

    row = {"status": "ok", "gate_error": 0.001, "gate_tolerance": 0.02, "gate_detail": "out 1e-3", "median_ms": 1.0,
           "hostname": "box", "kernel_library": "torch 2.11", "parts_reused": None, "peak_mem_bytes": 10}
    older = part_values(row, "2026-11-24T06:00:00+00:00")
    assert (older["gate"]["gate_at"], older["gate"]["gate_on"], older["gate"]["gate_library"]) == (None, None, None)
    assert older["time"]["timed_library"] is None and older["memory"]["memory_on"] is None
    newer = part_values({**row, "gate_at": "2026-11-27T01:00:00+00:00", "gate_on": "h1", "gate_library": "torch 2.11",
                         "timed_library": "torch 2.11 + magi-attention 1.1.1", "memory_on": "h2"}, None)
    assert (newer["gate"]["gate_at"], newer["gate"]["gate_on"]) == ("2026-11-27T01:00:00+00:00", "h1")
    assert newer["time"]["timed_library"] == "torch 2.11 + magi-attention 1.1.1"
    assert newer["memory"]["memory_on"] == "h2"
