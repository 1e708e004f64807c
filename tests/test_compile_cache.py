"""What a cell compiles is kept with the run (``results/compile_cache/``), and a measuring process
started later loads it instead of compiling again: the real Snakemake, FlexAttention compiled by
Inductor on the CPU, in the workflow's own measuring processes."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from snakemake_run import snakemake, write_config

import tiny
from longca import run_dir
from longca.execution.cache import compile_cache
from longca.execution.processes import worker

FLEX = tiny.grid(kernels=["flex"], masks=["causal"])
CELL = "results/cells/kernels/flex/causal/float32_fwd_64.json"


@pytest.fixture
def fresh_tmp(monkeypatch):
    """A temporary folder of the test's own as the processes' TMPDIR (where the compilers' default
    caches and the workers' sockets go; short, for socket paths), and no cache variable set."""
    path = Path(tempfile.mkdtemp(prefix="lc", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(path))
    for name in compile_cache.FOLDERS:
        monkeypatch.delenv(name, raising=False)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_a_compilation_is_kept_in_the_run_and_loaded_by_a_later_process(tmp_path, fresh_tmp):
    workdir = tmp_path / "run"
    write_config(workdir, FLEX)
    proc = snakemake(workdir, CELL)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert '"status": "ok"' in (workdir / CELL).read_text()

    cache = workdir / run_dir.COMPILE_CACHE
    compiled = _files(cache)
    assert any(f.startswith("inductor/fxgraph/") for f in compiled), sorted(compiled)
    # No compiled kernel went to Inductor's default place under TMPDIR (it keeps the C++ compiler's
    # precompiled headers there whatever its cache variable says).
    elsewhere = [f for d in fresh_tmp.glob("torchinductor_*") for f in _files(d)]
    assert not [f for f in elsewhere if not f.startswith("precompiled_headers/")], elsewhere

    # The cell measured again from nothing but the compile cache: its row, its parts and its copy
    # gone, so a new measuring process (a child forked for the cell) gates, times and compiles.
    first = (workdir / CELL).read_text()
    (workdir / CELL).unlink()
    shutil.rmtree(workdir / run_dir.STORE)
    shutil.rmtree(workdir / run_dir.KEPT, ignore_errors=True)
    proc = snakemake(workdir, CELL)
    assert proc.returncode == 0, proc.stderr[-4000:]
    again = (workdir / CELL).read_text()
    assert '"status": "ok"' in again and again != first  # measured again, not restored
    # Every compilation it needed was found: the cache holds exactly what the first run wrote.
    assert _files(cache) == compiled


def test_a_cache_variable_the_caller_set_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("CUTE_DSL_CACHE_DIR", "")  # empty counts as unset
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    now = compile_cache.point_at(tmp_path / "run" / "results" / "compile_cache")
    assert now == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "run/results/compile_cache/inductor"),
                   "TRITON_CACHE_DIR": str(tmp_path / "mine"),
                   "CUTE_DSL_CACHE_DIR": str(tmp_path / "run/results/compile_cache/cute")}
    assert {name: os.environ[name] for name in now} == now


def test_a_run_in_another_directory_gets_measuring_servers_of_its_own():
    """A server keeps the cache variables it started with, so servers are keyed on them."""
    one, other = (dict(os.environ, **compile_cache.environment(f"/runs/{name}/results/compile_cache"))
                  for name in ("a", "b"))
    assert worker.worker_key(one) != worker.worker_key(other)
    assert worker.worker_key(one) == worker.worker_key(dict(one))
