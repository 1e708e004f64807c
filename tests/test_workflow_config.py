"""Config keys of the workflow: per-kernel options, limits, isolation, GPUs, CP axes."""

import json
import os
import re
import subprocess

import pytest
from snakemake_run import REPO, command, snakemake, write_config

from longca.config import ConfigError, cell_limits, cell_settings, cp_cell_settings, cp_cells, validate
from longca.execution.processes import progress

# cp_strategies empty: the default grid's CP cells (on `causal`) would otherwise merge into these configs.
BASE = {"kernels": ["sdpa", "test_sleep"], "masks": ["full"], "seqlens": [64], "cp_strategies": []}


def test_kernel_options_reach_only_that_kernels_cells():
    plain = validate(BASE)
    cfg = validate({**BASE, "kernel_options": {"test_sleep": {"seconds": 0.5}}})
    assert cell_settings(cfg, "test_sleep", "full", 64, "fwd", "float32")["kernel_options"] == {"seconds": 0.5}
    # The other kernel's settings (its cache key) are exactly what they were without options.
    assert cell_settings(cfg, "sdpa", "full", 64, "fwd", "float32") == \
        cell_settings(plain, "sdpa", "full", 64, "fwd", "float32")
    assert "kernel_options" not in cell_settings(plain, "test_sleep", "full", 64, "fwd", "float32")


def test_limits_and_isolation_have_defaults_and_become_flags():
    cfg = validate(BASE)
    assert cfg["limits"] == {"cell_timeout_s": 600, "cell_memory_mb": None}
    assert cfg["isolation"] == "worker" and cfg["gpus"] == 0
    assert cell_limits(cfg) == "--isolation worker --timeout 600 --memory-mb 0 --gpus 0"
    cfg = validate({**BASE, "limits": {"cell_timeout_s": 2.5, "cell_memory_mb": 512}, "isolation": "fork"})
    assert cell_limits(cfg) == "--isolation fork --timeout 2.5 --memory-mb 512 --gpus 0"


@pytest.mark.parametrize("bad, named", [
    ({"kernel_options": {"flash9": {}}}, "config.kernel_options.flash9: unknown kernel"),
    ({"kernel_options": {"test_sleep": {"secs": 1}}}, "config.kernel_options.test_sleep: kernel 'test_sleep' has no option 'secs'"),
    ({"kernel_options": {"sdpa": 3}}, "config.kernel_options.sdpa"),
    ({"limits": {"cell_timeout_s": -1}}, "config.limits.cell_timeout_s"),
    ({"limits": {"cell_memory_mb": 0}}, "config.limits.cell_memory_mb"),
    ({"limits": {"timeout": 5}}, "config.limits"),
    ({"isolation": "threads"}, "config.isolation"),
    ({"gpus": -1}, "config.gpus"),
    ({"cp_sizes": [0]}, "config.cp_sizes[0]"),
    ({"cp_strategies": ["ring"]}, "config.cp_sizes: CP strategies are listed but no CP size"),
    ({"cp_strategies": ["spiral"], "cp_sizes": [2]}, "config.cp_strategies[0]: unknown CP strategy 'spiral'"),
    ({"cp_options": {"ring": {"degree": 2}}}, "config.cp_options.ring: unknown option 'degree'"),
    ({"cp_options": {"ring": {"local_kernel": "nosuch"}}}, "config.cp_options.ring.local_kernel: 'nosuch' is not one of auto,"),
    ({"cp_options": {"allgather": {"layout": "spiral"}}}, "config.cp_options.allgather.layout: 'spiral' is not one of"),
    ({"cp_options": {"ulysses": {"local_calls": "one"}}}, "config.cp_options.ulysses.local_calls: 'one' is not one of auto, pieces"),
    ({"cp_options": {"usp": {"ulysses_degree": -2}}}, "config.cp_options.usp.ulysses_degree: -2 is not a whole number >= 0"),
    ({"cp_options": {"ring": {"comm_sm_margin": 2.5}}}, "config.cp_options.ring.comm_sm_margin: 2.5 is not a whole number"),
    ({"cp_strategies": ["ring"], "cp_sizes": [2], "cp_masks": ["nope"]}, "config.cp_masks[0]: 'nope' is not one of config.masks"),
    ({"ranks_per_node": -1}, "config.ranks_per_node"),
])
def test_bad_workflow_keys_are_named(bad, named):
    with pytest.raises(ConfigError) as err:
        validate({**BASE, **bad})
    assert named in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("bad, says", [
    ({"kernel_options": {"test_sleep": {"secs": 1}}}, ("config.kernel_options.test_sleep", "'secs'")),
    ({"timing": {"reps": 1_000_000_000_000}}, ("config.timing.reps: 1000000000000 is greater than the maximum",)),
], ids=["kernel-option", "reps-past-its-bound"])
def test_snakemake_stops_on_a_bad_option_before_any_job(tmp_path, bad, says):
    write_config(tmp_path, {**BASE, **bad})
    proc = snakemake(tmp_path, "all")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert all(s in out for s in says), out[-3000:]
    # One message naming the key, not a traceback headed by the workflow's line that checked it.
    assert "common.smk" not in out and "Traceback" not in out and 'File "' not in out, out[-3000:]
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_a_yaml_error_in_the_embedded_config_names_its_file_and_line(tmp_path):
    """Snakemake's own message for a config it cannot parse names no file: the Snakefile reads
    config/config.yaml first.  (A checkout's copy with a typo in its config.)"""
    checkout = tmp_path / "checkout"
    (checkout / "config").mkdir(parents=True)
    for name in ("Snakefile", "workflow", "longca"):
        (checkout / name).symlink_to(REPO / name)
    (checkout / "config" / "config.yaml").write_text("kernels: [sdpa]\nseqlens: [64, 128\nmasks: [full]\n")
    write_config(tmp_path / "run", BASE)
    proc = snakemake(tmp_path / "run", "-n", "all", snakefile=checkout / "Snakefile")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"{checkout / 'config' / 'config.yaml'}, line 3, column 6: not valid YAML" in out, out[-3000:]


def planned_jobs(out: str) -> dict[str, list[str]]:
    """Rule name -> its planned jobs' text, from a dry run's output."""
    jobs = {}
    for block in re.split(r"\n(?=[ \t]*(?:local)?rule \w+:)", out):  # grouped jobs are indented
        m = re.match(r"[ \t]*(?:local)?rule (\w+):", block)
        if m:
            jobs.setdefault(m.group(1), []).append(block)
    return jobs


@pytest.mark.slow
def test_gpu_cells_get_a_gpu_each_and_share_the_cores(tmp_path):
    """N visible GPUs, isolation worker: each GPU cell asks for one GPU and cores/N threads, so N run
    at once.  Resident (the GPU default): a cell's job is a thin client (one core, no `gpu`), so
    Snakemake keeps clients queued on the devices' slots."""
    write_config(tmp_path, {**BASE, "kernels": ["sdpa"], "device": "cuda", "seqlens": [64, 128], "directions": ["fwd"],
                            "isolation": "worker"})
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="3,5")
    proc = subprocess.run(command(tmp_path, "all", "-n", cores=4), env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    jobs = planned_jobs(out)
    assert len(jobs["kernel_cell"]) == 2
    assert all("gpu=1" in b and "threads: 2" in b for b in jobs["kernel_cell"])
    # The machine-ceiling measurement takes a GPU like a cell does.
    assert len(jobs["ceilings"]) == 1 and "gpu=1" in jobs["ceilings"][0] and "threads: 2" in jobs["ceilings"][0]
    assert out.count("gpu=1") == 3
    write_config(tmp_path, {**BASE, "kernels": ["sdpa"], "device": "cuda", "seqlens": [64, 128], "directions": ["fwd"]})
    proc = subprocess.run(command(tmp_path, "all", "-n", "-p", cores=4), env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = planned_jobs(proc.stdout + proc.stderr)
    # (Snakemake prints no `threads:` line for one thread.)
    assert all("gpu=1" not in b and "threads:" not in b and "--isolation resident" in b and "--threads 2" in b
               for b in jobs["kernel_cell"]), jobs["kernel_cell"][0]
    assert "gpu=1" in jobs["ceilings"][0] and "threads: 2" in jobs["ceilings"][0]
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run(command(tmp_path, "all", "-n", cores=4), env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "config.device: cuda, but no GPU is visible" in proc.stdout + proc.stderr


def test_timing_budget_defaults_by_device_and_enters_cache_keys_only_when_set():
    cpu = validate(BASE)
    assert (cpu["timing"]["warmup_ms"], cpu["timing"]["warmup_max_ms"], cpu["timing"]["rep_ms"]) == (0, 0, 0)
    assert cpu["isolation"] == "worker"
    settings = cell_settings(cpu, "sdpa", "full", 64, "fwd", "float32")
    assert not {"warmup_ms", "warmup_max_ms", "rep_ms"} & set(settings)
    gpu = validate({**BASE, "device": "cuda"})
    assert gpu["isolation"] == "resident"
    settings = cell_settings(gpu, "sdpa", "full", 64, "fwd", "float32")
    assert (settings["warmup_ms"], settings["warmup_max_ms"], settings["rep_ms"]) == (25, 1000, 100)
    # CP cells warm up by count and duration: as long as a kernel cell's warm-up may last.
    assert cp_cell_settings(gpu, "ring", "full", 64, 2, "fwd", "float32")["warmup_ms"] == 1000
    explicit = validate({**BASE, "device": "cuda", "timing": {"warmup_ms": 0}})
    assert "warmup_ms" not in cell_settings(explicit, "sdpa", "full", 64, "fwd", "float32")


@pytest.mark.slow
def test_a_cp_cell_needing_more_gpus_than_the_run_sees_is_unsupported_at_once(tmp_path):
    """One visible GPU: the `gpu` resource is 1, a 1-rank CP cell takes it like any GPU cell, and a
    2-rank one is not started (two ranks on one GPU hang in NCCL) but becomes an `unsupported` row
    saying why, in its own file, so a run that has two GPUs measures it."""
    write_config(tmp_path, {**BASE, "kernels": ["sdpa"], "device": "cuda", "directions": ["fwd"],
                            "cp_strategies": ["ring"], "cp_sizes": [1, 2], "cp_masks": ["full"],
                            "cp_tokens_per_rank": [64]})
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="3")
    proc = subprocess.run(command(tmp_path, "all", "-n", cores=4), env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    jobs = planned_jobs(out)
    assert [b for b in jobs["cp_cell"] if "x1.json" in b and "gpu=1" in b], jobs["cp_cell"]
    assert not [b for b in jobs["cp_cell"] if "x2.json" in b]
    unplaced = "results/cells/cp_unplaced/ring/full/float32_fwd_64x2.json"
    assert len(jobs["cp_cell_unplaced"]) == 1 and unplaced in jobs["cp_cell_unplaced"][0]
    # The row is written at once, by the real rule, without starting torchrun.
    proc = subprocess.run(command(tmp_path, unplaced, cores=1), env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads((tmp_path / unplaced).read_text())
    assert row["status"] == "unsupported" and row["cp_size"] == 2 and row["kind"] == "cp"
    assert "needs 2 GPUs, one per rank; this run has 1" in row["reason"]
    # Not a measurement: the progress line, whose total counts only measured cells, does not count it.
    assert (tmp_path / progress.DEFAULT_DIR / "cells.tsv").read_text() == ""
    # With two GPUs the same cell is an ordinary CP cell holding both.
    env["CUDA_VISIBLE_DEVICES"] = "3,5"
    proc = subprocess.run(command(tmp_path, "all", "-n", cores=4), env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = planned_jobs(proc.stdout + proc.stderr)
    assert [b for b in jobs["cp_cell"] if "x2.json" in b and "gpu=2" in b] and "cp_cell_unplaced" not in jobs


def test_gpu_config_validates_on_a_login_node_without_gpus(tmp_path):
    """A run that submits jobs (Snakemake's --jobs, as the slurm profile sets) needs no GPU where it
    is started: the jobs ask for theirs."""
    write_config(tmp_path, {**BASE, "kernels": ["sdpa"], "device": "cuda", "directions": ["fwd"]})
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    local = subprocess.run(command(tmp_path, "all", "-n", cores=1), env=env, capture_output=True, text=True)
    assert local.returncode != 0 and "no GPU is visible" in local.stdout + local.stderr
    submit = subprocess.run(command(tmp_path, "all", "-n", "--jobs", "10", cores=1), env=env, capture_output=True,
                            text=True)
    assert submit.returncode == 0, submit.stderr[-3000:]


# cp_masks selects among masks: narrowing `masks` (the README's custom mask, `--config 'masks=[full]'`)
# drops the default grid's `cp_masks: [causal]` with a note, while a name that is no mask at all is a typo.
CP = {**BASE, "masks": ["full", "causal"], "cp_strategies": ["ring"], "cp_sizes": [2], "cp_tokens_per_rank": [64]}


@pytest.mark.parametrize("masks, cp_masks, runs, note", [
    (["full", "causal"], ["causal"], ["causal"], None),
    (["full", "causal"], None, ["full", "causal"], None),
    (["full"], ["causal"], [], "longca: cp_masks causal not in masks, so no CP cells for it (no CP cells)"),
    (["full", {"name": "doc", "slices": [[0, 4, 0, 4, "causal"]]}], ["full", "causal", "sliding_window"], ["full"],
     "longca: cp_masks causal, sliding_window not in masks, so no CP cells for them (CP cells run for full)"),
])
def test_cp_masks_select_among_masks(capsys, masks, cp_masks, runs, note):
    cfg = validate({**CP, "masks": masks, "cp_masks": cp_masks})
    assert sorted({c.mask for c in cp_cells(cfg)}) == sorted(runs)
    err = capsys.readouterr().err
    assert (note in err and err.count("longca: cp_masks") == 1) if note else "cp_masks" not in err


def test_a_cp_mask_that_is_no_mask_at_all_is_named():
    with pytest.raises(ConfigError, match=r"config.cp_masks\[1\]: 'casual' is not one of config.masks "
                                          r"\(causal, full\) nor a mask pattern"):
        validate({**CP, "cp_masks": ["causal", "casual"]})


def test_what_the_machine_can_hardly_run_is_said_before_the_run():
    from longca.config import implausible

    cfg = validate({**BASE, "seqlens": [8192], "cp_strategies": ["ring"], "cp_sizes": [2, 64], "gate_seqlen": 16384})
    said = implausible(cfg, cores=2)
    assert any(w.startswith("config.cp_sizes [64]: each CP cell starts that many ranks on this machine's 2 cores")
               for w in said), said
    assert any(w.startswith("config.gate_seqlen 16384 is above every seqlen") for w in said), said
    # More ranks than cores, however few.
    assert implausible(validate({**BASE, "cp_strategies": ["ring"], "cp_sizes": [4]}), cores=2)[0].startswith(
        "config.cp_sizes [4]: each CP cell starts that many ranks on this machine's 2 cores")
    # A length whose inputs alone pass the machine's memory (8 GiB here).
    cfg = validate({**BASE, "seqlens": [64, 10_000_000]})
    (said,) = implausible(cfg, cores=2, memory_bytes=8 * 2**30)
    assert said.startswith("config.seqlens [10000000]: at 10000000 a cell's inputs and outputs alone need") \
        and "more than this machine's 8.0 GiB" in said
    # A degree the strategy refuses at a size, with the config's heads and options.
    cfg = validate({**BASE, "cp_strategies": ["usp", "ring"], "cp_sizes": [2], "cp_options": {"usp": {"ulysses_degree": 3}}})
    assert implausible(cfg, cores=2) == ["config.cp_strategies 'usp' at cp_size 2: Ulysses degree 3 does not divide "
                                         "the 2 ranks; its cells there will be unsupported rows"]
    # Short lengths under the default gate length, and CP sizes the cores can hold: nothing to say.
    assert implausible(validate({**BASE, "cp_strategies": ["ring"], "cp_sizes": [2]}), cores=2,
                       memory_bytes=8 * 2**30) == []
