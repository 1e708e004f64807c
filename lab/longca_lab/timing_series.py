"""Inside the loops: every sample of the workflow's timing and of do_bench on the same call.

    python lab/longca_lab/timing_series.py OUTDIR --budget-s 240 --cells CELL ... [--rounds 3]
        [--configfile config/gpu.yaml] [--long-rep-ms 1000]

For each named cell of the config (``kernel/mask/dtype_dir_seqlen``, as lab/longca_lab/bench_pipeline.py
names them) the call the workflow times (``longca.execution.measure.timed.cell_call``: the captured CUDA
graph's replay) is built once and timed, round after round, three ways in one process:

* ``harness``: the workflow's own ``timing.measure`` with the cell's settings (its median and the
  count of timed calls it made);
* ``do_bench``: ``triton.testing.do_bench(warmup=25, rep=100)`` with ``return_mode="all"``, the bare
  loop of bench_pipeline.py, every sample kept;
* ``do_bench_long``: the same with ``rep=--long-rep-ms`` (many samples).

When a call takes tens of milliseconds, do_bench's 100 ms budget is one or two timed calls; this
shows where within the loop those calls fall and how they compare with the median of many.  The
cell's correctness is not checked here (the workflow's gate did that); this is a timing probe.
Written to OUTDIR: ``series.jsonl`` (one line per cell and round, all samples) and ``summary.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from longca_lab.workflow_config import REPO, resolved

from longca.api import config as longca_config


def cell_probe_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments every probe of named cells takes (lab/longca_lab/peak_memory.py too)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir", type=Path)
    p.add_argument("--budget-s", type=float, required=True, help="start no cell after this many seconds")
    p.add_argument("--cells", nargs="+", required=True, metavar="CELL")
    p.add_argument("--configfile", type=Path, default=REPO / "config" / "gpu.yaml")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = cell_probe_parser(__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--long-rep-ms", type=float, default=1000.0)
    return p.parse_args(argv)


def specs(configfile: Path, names: list[str]) -> list:
    """The cells' settings; a name that is no cell of the config stops the run before any work."""
    from longca.api import CellSpec

    cfg = resolved(configfile)
    try:
        cells = longca_config.named_cells(cfg, names)
    except longca_config.ConfigError as exc:
        raise SystemExit(f"--cells ({configfile}): {exc}") from None
    return [CellSpec.from_dict(longca_config.cell_settings(cfg, c.kernel, c.mask, c.seqlen, c.direction, c.dtype))
            for c in cells]


def kernel_and_problem(spec) -> tuple:
    """A named cell's kernel (with its options), its problem, and why the kernel cannot run it (None:
    it can): what every probe of named cells builds first."""
    from longca.api import kernels

    kernel = kernels.get(spec.kernel).with_options(spec.kernel_options)
    problem = spec.problem()
    return kernel, problem, kernel.supports(problem)


MIB = 2 ** 20


def mib_text(value) -> str:
    """Bytes as MiB for a probe's table ('–' for none)."""
    return "–" if value is None else f"{value / MIB:,.1f}"


def samples_do_bench(call, device, rep_ms: float) -> list[float]:
    if device.type == "cuda":
        import triton.testing

        return list(triton.testing.do_bench(call, warmup=25, rep=rep_ms, return_mode="all"))
    from longca.api import timing  # a CPU smoke test: no do_bench there

    return timing.sample(call, device=device, warmup=1, reps=3)[0]


def probe(spec, rounds: int, long_rep_ms: float) -> list[dict]:
    from longca.api import kernels
    from longca.api import attention_flops
    from longca.api import timing
    from longca.api import cell_call

    kernel = kernels.get(spec.kernel).with_options(spec.kernel_options)
    problem = spec.problem()
    flops = attention_flops(problem.mask, spec.heads_q, spec.head_dim, spec.direction, spec.batch)
    tflops = lambda ms: flops / (ms * 1e-3) / 1e12  # noqa: E731
    rows = []
    with cell_call(kernel, problem, max(spec.warmup, kernel.min_warmup), spec.cuda_graph) as (call, _, facts):
        for i in range(rounds):
            t = timing.measure(call, device=problem.device, warmup=spec.warmup, reps=spec.reps,
                               warmup_ms=spec.warmup_ms, warmup_max_ms=spec.warmup_max_ms, rep_ms=spec.rep_ms)
            short = samples_do_bench(call, problem.device, 100.0)
            long = samples_do_bench(call, problem.device, long_rep_ms)
            rows.append({"round": i, "flops": flops, "timed_via": facts.get("timed_via"),
                         "harness_tflops": tflops(t.median_ms), "harness_reps": t.reps,
                         "harness_warmup_calls": t.warmup_calls,
                         "do_bench_ms": short, "do_bench_tflops": tflops(statistics.median(short)),
                         "do_bench_long_ms": long, "do_bench_long_tflops": tflops(statistics.median(long))})
    return rows


def summary(rows: list[dict]) -> str:
    lines = ["| cell | round | harness TFLOPs/s (timed calls) | do_bench(25, 100): each sample, TFLOPs/s "
             "| do_bench(25, 100) median | do_bench long median (samples) | harness / do_bench | "
             "harness / do_bench long |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        each = ", ".join(f"{r['flops'] / (ms * 1e-3) / 1e12:.0f}" for ms in r["do_bench_ms"][:8])
        more = f" … ({len(r['do_bench_ms'])})" if len(r["do_bench_ms"]) > 8 else ""
        lines.append(f"| {r['cell']} | {r['round']} | {r['harness_tflops']:.1f} ({r['harness_reps']}) | {each}{more} "
                     f"| {r['do_bench_tflops']:.1f} | {r['do_bench_long_tflops']:.1f} ({len(r['do_bench_long_ms'])}) "
                     f"| {r['harness_tflops'] / r['do_bench_tflops']:.3f} "
                     f"| {r['harness_tflops'] / r['do_bench_long_tflops']:.3f} |")
    return "\n".join(lines) + "\n"


def probe_cells(outdir: Path, budget_s: float, names: list[str], cells: list, probe_one, jsonl: str,
                summary_of) -> list[dict]:
    """Probe each cell in order (one process), each row to OUTDIR/jsonl as it comes, the summary
    to OUTDIR/summary.md; no cell starts after ``budget_s``.  lab/longca_lab/peak_memory.py uses it too."""
    outdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rows = []
    with open(outdir / jsonl, "w") as sink:
        for name, spec in zip(names, cells):
            if time.monotonic() - started > budget_s:
                print(f"budget spent: {name} and later cells not probed")
                break
            for row in probe_one(spec):
                row["cell"] = name
                rows.append(row)
                sink.write(json.dumps(row) + "\n")
                sink.flush()
            print(f"{name}: probed", flush=True)
    text = summary_of(rows)
    (outdir / "summary.md").write_text(text)
    print(text)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    cells = specs(args.configfile, args.cells)
    probe_cells(args.outdir, args.budget_s, args.cells, cells, lambda spec: probe(spec, args.rounds, args.long_rep_ms),
                "series.jsonl", summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
