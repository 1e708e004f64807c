"""``longca``: thin command line over the library (the Snakemake rules call these)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import cells, problem_settings, timing_spec
from .execution.cache import kept_rows, store  # light (no torch): run-cell's worker client must start fast
from .execution.processes import progress

# `longca status` asks Snakemake about this workflow unless told another.
CHECKOUT_SNAKEFILE = Path(__file__).resolve().parent.parent / "Snakefile"


# CellSpec's fields, for building settings from flags without importing torch (the worker client
# must stay light).  CellSpec.from_dict re-checks them in the measuring process.
def _flag_settings(args: argparse.Namespace) -> dict:
    missing = [f"--{k}" for k in ("kernel", "mask", "seqlen") if getattr(args, k) is None]
    if missing:
        raise SystemExit(f"longca run-cell: {', '.join(missing)} required (or --settings)")
    return {"kernel": args.kernel, **problem_settings.settled({name: getattr(args, name) for name in problem_settings.names()}),
            "gate_seqlen": args.gate_seqlen, **{name: getattr(args, name) for name in timing_spec.names()}}


def _run_cell(args: argparse.Namespace) -> int:
    from .execution.cache.atomic import write_json_atomic

    settings = json.loads(args.settings) if args.settings else _flag_settings(args)
    cell_id = args.cell_id or cells.kernel_cell_id(settings)
    timeout = args.timeout or None
    fingerprint = kept_rows.kernel_fingerprint(settings.get("kernel")) if args.out else None
    kept = kept_rows.recall(args.out, settings, fingerprint) if fingerprint else None
    if kept is not None:  # measured by an earlier job that was lost before Snakemake recorded it
        from .execution.cache.atomic import write_json_atomic

        write_json_atomic(kept, args.out)
        print(f"{kept['cell_id']}: {kept['status']} (kept row of an earlier job, not measured again)",
              file=sys.stderr)
        progress.record(cell_id, kept)
        return 0
    if args.isolation in ("worker", "resident"):
        from .execution.processes.worker import WorkerError

        request = _client_request(args.isolation)
        try:
            row = request(settings, cell_id=cell_id, threads=args.threads, timeout_s=timeout,
                          memory_mb=args.memory_mb or None, gpus=args.gpus)
        except WorkerError as exc:  # the machinery failed, not the cell: no row, the job fails
            print(f"longca run-cell: {exc}", file=sys.stderr)
            return 2
    elif args.isolation == "fork":
        from .execution.processes.runner import Limits, measure, preload

        preload()  # once, here, rather than in the child and again for the fingerprint
        row = measure(settings, cell_id=cell_id, threads=args.threads,
                      limits=Limits(timeout_s=timeout, memory_mb=args.memory_mb or None, gpus=args.gpus),
                      store_root=store.root_from_env())
    else:  # in this process: for a debugger; a crash here is a crash
        import torch

        from .execution.measure.cell import CellSpec, run_cell
        from .execution.processes.runner import _fingerprint

        if args.threads:
            torch.set_num_threads(args.threads)
        row = run_cell(CellSpec.from_dict(settings), store.from_env())
        row.update(cell_id=cell_id, fingerprint=_fingerprint(settings.get("kernel")))
    row["isolation"] = args.isolation  # how the number was measured, for whoever compares rows
    if args.out:
        write_json_atomic(row, args.out)
        kept_rows.keep(args.out, settings, fingerprint, row)
    else:
        json.dump(row, sys.stdout, indent=1, sort_keys=True, default=str)
        print()
    summary = f"{row['cell_id']}: {row['status']}"
    summary += f" {row['tflops']:.3f} TFLOPs/s" if row["status"] == "ok" else f" ({row['reason']})"
    print(summary, file=sys.stderr)
    progress.record(cell_id, row)  # the run's progress line (longca/execution/processes/progress.py); nothing outside a run
    return 0  # a failed cell is a result, not a failed command


def _client_request(isolation: str):
    """The thin client for a warm measuring server; neither imports torch."""
    if isolation == "resident":
        from .execution.processes.resident import request
    else:
        from .execution.processes.worker import request
    return request


def _worker(args: argparse.Namespace) -> int:
    from .execution.processes.worker import serve

    return serve(args.socket, args.idle)


def _lane(args: argparse.Namespace) -> int:
    from .execution.processes.resident import serve

    return serve(args.socket, args.device, args.idle)


def _kernels(args: argparse.Namespace) -> int:
    from . import kernels

    here = _devices_here()
    for name in kernels.names():
        kernel = kernels.get(name)
        print(f"{name:19s} {'/'.join(kernel.devices):9s} {_availability(kernel, here)}  {kernel.description}")
    return 0


def _devices_here() -> list[str]:
    return ["cpu", "cuda"] if _cuda_available() else ["cpu"]


def _availability(kernel, here: list[str]) -> str:
    """Whether ``kernel`` runs on this machine, per device it has: its library present (the adapter's
    ``available``) and one of its devices here (a CUDA-only kernel on a CPU machine does not run)."""
    missing = kernel.available()
    runs_on = [d for d in kernel.devices if d in here]
    if not runs_on:
        needs = " or ".join(d.upper() if d == "cuda" else d for d in kernel.devices)
        return f"unavailable here: needs {needs}" + (f" (and {missing})" if missing else "")
    return f"unavailable: {missing}" if missing else f"available on {', '.join(runs_on)}"


def _masks(args: argparse.Namespace) -> int:
    import inspect

    from .attention import masks

    builders = {**masks.PATTERNS, **masks.EXTRA_PATTERNS}
    width = max(map(len, builders)) + 1
    print(f"{'pattern':{width}s} parameters (default; auto: resolved from seqlen, seed and documents, see docs/masks.md)")
    for name, builder in builders.items():
        params = []
        for p in inspect.signature(builder).parameters.values():
            if p.name in ("seqlen", "seed") or p.kind is p.VAR_KEYWORD:
                continue  # seed is the config's `seed`, for every pattern
            default = p.default
            params.append(f"{p.name} (required)" if default in ((), []) else
                          f"{p.name}=auto" if default is None else f"{p.name}={default!r}")
        doc = " ".join((builder.__doc__ or "").split("\n\n")[0].split()).replace("``", "")  # its first paragraph
        print(f"{name:{width}s} {', '.join(params) or '-'}\n{'':{width}s} {doc}")
    return 0


def _unknown_names(what: str, names: list[str] | None, known: list[str]) -> str | None:
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        return f"unknown {what}{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; known: {', '.join(known)}"
    return None


def _check(args: argparse.Namespace) -> int:
    from . import kernels
    from .execution.measure.check import check, check_masks, format_table

    # Names first, before any measurement: a typo is a usage error (exit 2), not a traceback.
    problems = [p for p in (_unknown_names("kernel", args.kernels, kernels.names()),
                            _unknown_names("mask", args.masks, check_masks())) if p]
    if problems:
        print("\n".join(f"longca check: {p}" for p in problems), file=sys.stderr)
        return 2
    args.device = args.device or ("cuda" if _cuda_available() else "cpu")
    names = args.kernels or [n for n in kernels.names()
                             if not kernels.get(n).available() and args.device in kernels.get(n).devices]
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    results = check(names, args.masks or check_masks(), args.directions, device=args.device, dtype=dtype,
                    seqlen=args.seqlen, heads_q=args.heads_q, heads_kv=args.heads_kv, head_dim=args.head_dim)
    print(format_table(results))
    # wrong answers (and crashes) fail the command; unsupported combinations do not.
    return 1 if any(r.status in ("wrong", "error") for r in results) else 0


def _status(args: argparse.Namespace) -> int:
    from .config import ConfigError
    from .status import format_status, status

    try:
        result = status(args.snakefile, configfiles=args.configfile, directory=args.directory, config=args.config)
    except (ConfigError, RuntimeError) as exc:
        print(f"longca status: {exc}", file=sys.stderr)
        return 2
    print(format_status(result, listing=args.list))
    return 0


def _remeasure(args: argparse.Namespace) -> int:
    from .execution.cache.remeasure import set_aside

    try:
        folder, moved = set_aside(args.rows, parts=args.parts, root=args.directory)
    except ValueError as exc:
        print(f"longca remeasure: {exc}", file=sys.stderr)
        return 2
    print(f"set aside {len(moved)} files under {folder} (rows, kept copies and the stored {', '.join(args.parts)} "
          f"parts); `snakemake all` measures {len(args.rows)} cell(s) again")
    return 0


def _aggregate(args: argparse.Namespace) -> int:
    from .results.parquet import CP_SCHEMA, KERNEL_SCHEMA, aggregate, read_rows

    table_name = args.table
    if table_name == "auto":  # by what the rows are: a CP row in a kernel table would lose its columns
        kinds = {row.get("kind") for row in read_rows(args.cells)} - {None}
        if len(kinds) > 1:
            raise SystemExit(f"longca aggregate: the cells are of kinds {', '.join(sorted(kinds))}; "
                             "aggregate each kind on its own (--table kernels or cp)")
        table_name = "cp" if kinds == {"cp"} else "kernels"
    table = aggregate(args.cells, args.out, schema={"kernels": KERNEL_SCHEMA, "cp": CP_SCHEMA}[table_name])
    print(f"{args.out}: {table.num_rows} rows", file=sys.stderr)
    return 0


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _cp_cell(args: argparse.Namespace) -> int:
    from .execution.cluster.cp_launch import run

    settings = json.loads(args.settings)
    cell_id = args.cell_id or cells.cp_cell_id(settings)
    if args.unsupported:  # a cell this run cannot place: its row says why, nothing is started
        from .execution.cache.atomic import write_json_atomic
        from .execution.cluster.cp_launch import failure_row

        row = failure_row(settings, "unsupported", args.unsupported, cell_id=cell_id, fingerprint=args.fingerprint,
                          wall_s=0.0)
        write_json_atomic(row, args.out)
        print(f"{cell_id}: unsupported ({row['reason']})", file=sys.stderr)
        return 0  # not a measurement: the progress line counts only the cell jobs it planned
    row = run(settings, args.out, cell_id=cell_id, fingerprint=args.fingerprint, timeout_s=args.timeout,
              threads=args.threads, isolation=args.isolation, job_started=args.job_started)
    summary = f"{cell_id}: {row['status']}"
    summary += (f" {row['tflops_per_gpu']:.3f} TFLOPs/s per GPU" if row["status"] == "ok"
                else f" ({row['reason']})")
    print(summary, file=sys.stderr)
    progress.record(cell_id, row)  # the run's progress line (longca/execution/processes/progress.py); nothing outside a run
    return 0


def _cp_group(args: argparse.Namespace) -> int:
    from .execution.cluster.cp_group import exec_group

    return exec_group(args)


def _cp_strategies(args: argparse.Namespace) -> int:
    from . import cp

    for name in cp.names():
        cls = cp.get(name)
        print(f"{name:16s} {cls.description}  (options: {json.dumps(cls.options, sort_keys=True)})")
    return 0


def _table(path: str, kind: str, columns: tuple[str, ...]):
    """A Parquet table a command reads, or ValueError saying why it is not the ``kind`` table asked for."""
    import pandas as pd

    if not Path(path).is_file():
        raise ValueError(f"{path}: no such file (the {kind} table: a run's results/{kind}.parquet)")
    try:
        table = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 — pyarrow's errors name neither the file nor what it wanted
        raise ValueError(f"{path}: not a Parquet table ({type(exc).__name__}: {exc})") from None
    missing = [c for c in columns if c not in table]
    if missing:
        raise ValueError(f"{path}: not a {kind} table (no column {', '.join(missing)}; "
                         f"is it the {'kernels' if kind == 'cp' else 'cp'} table?)")
    if not (table["status"] == "ok").any():
        raise ValueError(f"{path}: no ok row to fit on")
    return table


def _exposed_lines(exposed) -> list[str]:
    """The fitted table's measured exposed communication (config ``cp_exposed_comm``) beside the
    model's, one line per row; nothing where the table measured none."""
    import pandas as pd

    if not len(exposed):
        return []
    lines = ["# measured, the fitted table's rows (cp_exposed_comm: the step less the same step with local "
             "copies for collectives) beside the model's; a measured value within its spread is a tie with 0",
             "strategy      cp  mask            dir  tokens/GPU  measured ms  spread ms  model ms"]
    for r in exposed.itertuples():
        model = "-" if pd.isna(r.predicted_exposed_comm_ms) else f"{r.predicted_exposed_comm_ms:8.3f}"
        lines.append(f"{r.strategy:12s} {r.cp_size:3d}  {r.mask:14s}  {r.direction:3s}  {r.tokens_per_rank:10d}  "
                     f"{r.measured_exposed_comm_ms:11.3f}  {r.spread_ms:9.3f}  {model}" + (f"  ({r.why})" if model == "-" and r.why else ""))
    return lines


def _predict(args: argparse.Namespace) -> int:
    import pandas as pd

    from .results import cp_model

    try:
        cp = _table(args.cp, "cp", ("strategy", "cp_size", "tokens_per_rank", "status"))
        kernels = _table(args.kernels, "kernels", ("kernel", "seqlen", "status"))
        model, table = cp_model.predictions(cp, kernels, args.strategies, args.mask, args.direction,
                                            args.tokens_per_rank, args.cp_sizes, args.gpus_per_node,
                                            args.network_gbs, args.nvlink_gbs)
    except (OSError, ValueError, KeyError) as exc:
        print(f"longca predict: {exc}", file=sys.stderr)
        return 2
    lines = [f"# predicted, not measured: {args.mask} {args.direction}, {args.tokens_per_rank} tokens per GPU; "
             f"fitted on {args.cp}: NVLink {model.links.nvlink_gbs:.0f} GB/s, {model.call_s * 1e6:.0f} µs per local "
             f"call, {model.row_s * 1e9:.0f} ns per reduced query row; network {args.network_gbs:g} GB/s per GPU, "
             f"{args.gpus_per_node} GPUs per node; step = waited transfers + sum over blocks of max(block, its hop) "
             "(docs/cp.md); * the best at its size",
             "strategy      cp  TFLOPs/s/GPU  best  compute ms  exposed comm ms  sent MiB"]
    figures = pd.to_numeric(table["tflops_per_gpu"], errors="coerce")
    best = figures.groupby(table["cp_size"]).transform("max")
    for r, figure, top in zip(table.itertuples(), figures, best):
        if pd.isna(figure):
            lines.append(f"{r.strategy:12s} {r.cp_size:3d}  {'refused' if getattr(r, 'refused', False) is True else 'not modelled'}: {r.why}")
        else:
            lines.append(f"{r.strategy:12s} {r.cp_size:3d}  {figure:12.4g}  {'*' if figure == top else '-':>4s}  "
                         f"{r.compute_ms:10.3f}  {r.exposed_comm_ms:15.3f}  {r.sent_bytes / 2**20:8.0f}")
    lines += _exposed_lines(cp_model.exposed_comm(model, cp))
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:  # `longca predict ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


class FlagHelp(argparse.HelpFormatter):
    """Each flag's help ends with its default, unless the help says it or there is none to say."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text or action.required or not action.option_strings
                or action.default in (None, False, argparse.SUPPRESS)):
            return text
        return f"{text} (default: %(default)s)"


# The published tables `longca plan` reads by GPU model (docs/results/), when --cp/--kernels are not given.
PUBLISHED_TABLES = {
    "H100": ("cp_4xh100_graphs_2026-11-27/cp.parquet", "h100_2026-11-23/kernels.parquet"),
    "H200": ("cp_2xh200_2026-11-27/cp.parquet", "h200_2026-11-23/kernels.parquet"),
}
PUBLISHED_DIR = CHECKOUT_SNAKEFILE.parent / "docs" / "results"


def _gib(value) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


def _pct(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def _plan(args: argparse.Namespace) -> int:
    from .results import gpus, plan

    gpu = args.gpu.upper()
    memory = args.gpu_memory_gib * 2**30 if args.gpu_memory_gib else gpus.memory_bytes(gpu)
    if memory is None:
        print(f"longca plan: unknown GPU {args.gpu!r} (known: {', '.join(gpus.MEMORY_MIB)}); give --gpu-memory-gib",
              file=sys.stderr)
        return 2
    published = PUBLISHED_TABLES.get(gpu)
    cp_path = args.cp or (str(PUBLISHED_DIR / published[0]) if published else None)
    kernels_path = args.kernels or (str(PUBLISHED_DIR / published[1]) if published else None)
    if not cp_path or not kernels_path:
        print(f"longca plan: no published tables for {args.gpu}: give --cp and --kernels (a run's results/*.parquet)",
              file=sys.stderr)
        return 2
    try:
        tables = plan.Tables(_table(cp_path, "cp", ("strategy", "cp_size", "tokens_per_rank", "status")),
                             _table(kernels_path, "kernels", ("kernel", "seqlen", "status")), cp_path, kernels_path)
    except (OSError, ValueError, KeyError) as exc:
        print(f"longca plan: {exc}", file=sys.stderr)
        return 2
    shape = plan.Shape(args.heads_q, args.heads_kv, args.head_dim, args.dtype)
    if args.fewest:
        rows = [plan.fewest(tables, s, args.mask, args.tokens, shape, memory, args.fewest_up_to) for s in args.strategies]
    else:
        rows = [plan.row(tables, s, args.mask, args.tokens, p, shape, memory) for p in args.gpus for s in args.strategies]
    cp = tables.cp[tables.cp["status"] == "ok"]
    lengths = sorted(int(t) for t in cp["tokens_per_rank"].unique())
    sizes = sorted(int(p) for p in cp["cp_size"].unique())
    _, workspace_from = tables.workspace(args.mask, "bwd", rows[0]["tokens_per_gpu"], shape)
    lines = [f"# longca plan: {args.tokens} tokens, {args.mask}, {args.heads_q}:{args.heads_kv} heads, d{args.head_dim} "
             f"{args.dtype}, on {args.gpu} ({memory / 2**30:.1f} GiB a GPU); tables {cp_path} (local kernel "
             f"{tables.local_kernel}) and {kernels_path}",
             f"# measured: {tables.local_kernel}'s full-mask rate (kernel table); each strategy's cp_size-1 efficiency at "
             f"{', '.join(map(str, lengths))} tokens per GPU; links and per-call costs fitted at cp_size "
             f"{', '.join(map(str, sizes))}; the kernels' peak memory by length",
             f"# extrapolated: tokens per GPU above {lengths[-1]} (the efficiency of the nearest length), GPU counts "
             f"above {sizes[-1]}, the workspace ({workspace_from}); the strategies' buffers are counted from what "
             "they send, not measured"]
    for axis in plan.HELD_OUT_AXES:
        h = plan.held_out_time(tables, axis)
        lines.append(f"# held out, time, by {plan.HELD_OUT_AXES[axis]}: " + (h["why"] if h["why"] else
                     f"fitted without {h['held']}, checked there: median {_pct(h['median'])}, max {_pct(h['max'])} "
                     f"over {h['rows']} rows (per-GPU TFLOPs/s)"))
    m = plan.held_out_memory(tables)
    lines.append(f"# held out, memory model: each kernel x mask x direction without its longest length: median "
                 f"{_pct(m['median'])}, max {_pct(m['max'])} over {m['groups']} groups")
    c = plan.memory_check(tables)
    lines.append("# memory against the CP table's per-rank peaks: " + (c["why"] if c["why"] else
                 f"median {_pct(c['median'])}, max {_pct(c['max'])} off over {c['rows']} rows "
                 f"({c['under']} below the measured)"))
    # Held out by GPU model: cp_memory's coefficients fitted on another GPU model's published CP table.
    other = next((g for g in PUBLISHED_TABLES if g != gpu), None)
    train = None
    if other:
        paths = [str(PUBLISHED_DIR / name) for name in PUBLISHED_TABLES[other]]
        train = plan.Tables(_table(paths[0], "cp", ("strategy", "cp_size", "tokens_per_rank", "status")),
                            _table(paths[1], "kernels", ("kernel", "seqlen", "status")), paths[0], paths[1])
    h = plan.memory_held_out(tables, train)
    if h["why"]:
        lines.append("# held out, memory against the per-rank peaks: " + h["why"])
    else:
        k = h["coef"]
        lines.append(f"# held out, memory against the per-rank peaks: {k['constant'] / 2**20:.0f} MiB + "
                     f"{k['kernel']:.2f} kernel + {k['harness']:.2f} harness + {k['buffers']:.2f} buffers fitted on "
                     f"{h['fitted_rows']} rows of {h['fitted_on']}, checked here: " + "; ".join(
                         f"{d} median {_pct(e['median'])}, max {_pct(e['max'])} over {e['rows']} rows ({e['under']} below)"
                         for d, e in h["by_direction"].items()))
    lines.append("# memory is the backward's (it holds the most), GiB per GPU; fits: within the GPU's memory "
                 "('?': a part not modelled); ms: one step's attention, forward and backward")
    header = (f"{'strategy':12s} {'GPUs':>5s} {'tokens/GPU':>10s} {'inputs':>7s} {'outputs':>7s} {'grads':>7s} "
              f"{'workspace':>9s} {'buffers':>7s} {'total':>7s} {'fits':>4s} {'fwd ms':>9s} {'bwd ms':>9s}")
    lines.append(header)
    for r in rows:
        fits = "-" if r["refused"] else {True: "yes", False: "no", None: "?"}[r["fits"]]
        times = [f"{r[d + '_ms']:9.1f}" if r[d + "_ms"] is not None else f"{'-':>9s}" for d in ("fwd", "bwd")]
        why = r["refused"] or r["fwd_why"] or r["bwd_why"]
        lines.append(f"{r['strategy']:12s} {r['gpus']:5d} {r['tokens_per_gpu']:10d} {_gib(r['inputs']):>7s} "
                     f"{_gib(r['outputs']):>7s} {_gib(r['gradients']):>7s} {_gib(r['workspace']):>9s} "
                     f"{_gib(r['buffers']):>7s} {_gib(r['total']):>7s} {fits:>4s} {times[0]} {times[1]}"
                     + (f"  ({why})" if why else ""))
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:  # `longca plan ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="longca", description="LongCA's command line: what the workflow's rules "
                                     "call, and tools to inspect a run (status, aggregate, check).")
    parser.add_argument("--version", action="version", version=f"longca {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        """A subcommand whose --help starts with what it does and gives each flag's default."""
        return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                              formatter_class=FlagHelp)

    cell = command("run-cell", help="measure one kernel cell and write one JSON row")
    cell.add_argument("--settings", default=None,
                      help="JSON object of every cell setting (what the workflow passes); overrides the flags")
    cell.add_argument("--kernel", help="the kernel to measure (`longca kernels` lists them)")
    problem_settings.add_flags(cell)
    timing_spec.add_flags(cell)
    cell.add_argument("--gate-seqlen", type=int, default=512,
                      help="length of the correctness gate's problem (the mask rebuilt there, structure kept)")
    cell.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    cell.add_argument("--cell-id", default=None, help="the row's cell_id (default: derived from the settings)")
    cell.add_argument("--out", default=None, help="JSON file to write (default: stdout)")
    cell.add_argument("--isolation", default="fork", choices=["resident", "worker", "fork", "none"],
                      help="where the measurement runs: the device's long-lived measuring process (a fresh one "
                           "after a crash), a child forked by the shared warm worker, a child forked by this "
                           "process (default), or this process (debugging: a crash is a crash)")
    cell.add_argument("--timeout", type=float, default=600.0,
                      help="seconds before the measuring child is killed and the row says timeout (0: none)")
    cell.add_argument("--memory-mb", type=int, default=0,
                      help="address space the measuring child may map beyond its start (CPU; 0: no cap)")
    cell.add_argument("--gpus", type=int, default=0, help="GPU slots for cuda cells (0: every visible GPU)")
    cell.set_defaults(func=_run_cell)

    worker = command("worker", help="serve cells from a warm process (started by run-cell --isolation worker)")
    worker.add_argument("--socket", required=True, help="the Unix socket to serve on")
    worker.add_argument("--idle", type=float, default=None,
                        help="exit after this many idle seconds (default: $LONGCA_WORKER_IDLE_S or 120)")
    worker.set_defaults(func=_worker)

    lane = command("lane", help="serve one device's cells from a resident measuring process "
                                       "(started by run-cell --isolation resident)")
    lane.add_argument("--socket", required=True, help="the Unix socket to serve on")
    lane.add_argument("--device", required=True, help="the GPU (a CUDA_VISIBLE_DEVICES entry) or 'cpu'")
    lane.add_argument("--idle", type=float, default=None,
                      help="exit after this many idle seconds (default: $LONGCA_WORKER_IDLE_S or 120)")
    lane.set_defaults(func=_lane)

    cpc = command("cp-cell", help="measure one CP cell under torchrun and write one JSON row")
    cpc.add_argument("--settings", required=True, help="the cell's resolved settings (JSON)")
    cpc.add_argument("--out", required=True, help="JSON file to write the row to")
    cpc.add_argument("--cell-id", default=None, help="the row's cell_id (default: derived from the settings)")
    cpc.add_argument("--fingerprint", default=None, help="the code fingerprint the row records (the rule passes it)")
    cpc.add_argument("--timeout", type=float, default=600, help="seconds before the whole job is killed")
    cpc.add_argument("--threads", type=int, default=0, help="CPU threads for the cell, shared by its ranks")
    cpc.add_argument("--isolation", default="fork", choices=("fork", "worker", "resident"),
                     help="fork: a torchrun of its own; worker/resident: the resident group of its GPU set")
    cpc.add_argument("--job-started", type=float, default=None, metavar="EPOCH_S",
                     help="when the cell's job began (the row's job_wall_s runs from there; default: now)")
    cpc.add_argument("--unsupported", default=None, metavar="REASON",
                     help="write an `unsupported` row with this reason instead of running the cell")
    cpc.set_defaults(func=_cp_cell)

    cpg = command("cp-group", help="serve CP cells from a resident torchrun group on a GPU set "
                                          "(started by cp-cell --isolation worker/resident)")
    cpg.add_argument("--socket", required=True, help="the Unix socket to serve on")
    cpg.add_argument("--nproc", type=int, required=True, help="ranks in the group (the CP size)")
    cpg.add_argument("--device", choices=("cpu", "cuda"), required=True, help="gloo on cpu, NCCL on cuda")
    cpg.add_argument("--devices", default="", help="the GPUs (CUDA_VISIBLE_DEVICES entries), comma-separated")
    cpg.add_argument("--threads", type=int, default=0, help="torch CPU threads per rank")
    cpg.add_argument("--collective-timeout", type=float, default=480.0,
                     help="seconds a collective may wait before the group gives up")
    cpg.add_argument("--cp-env", default="default",
                     help="the CP launch environment set in the ranks' environment (longca/cp_envs.yaml)")
    cpg.set_defaults(func=_cp_group)

    cps = command("cp-strategies", help="list the CP strategies and their options")
    cps.set_defaults(func=_cp_strategies)

    ks = command("kernels", help="list kernels and whether they run on this machine, per device it has")
    ks.set_defaults(func=_kernels)

    ms = command("masks", help="list the mask patterns with their parameters and defaults")
    ms.set_defaults(func=_masks)

    st = command("status", help="which cells of the configured grid are cached, missing or stale "
                                       "(Snakemake's own summary and dry run)")
    st.add_argument("--configfile", nargs="+", default=[], metavar="FILE",
                    help="config files over config/config.yaml, as for snakemake")
    st.add_argument("--config", nargs="+", default=[], metavar="KEY=VALUE", help="overrides, as for snakemake")
    st.add_argument("--directory", "-d", default=None, help="the run directory (default: here)")
    st.add_argument("--snakefile", "-s", default=str(CHECKOUT_SNAKEFILE),
                    help="the workflow (default: the Snakefile of the checkout this longca runs from)")
    st.add_argument("--list", action="store_true", help="name every missing and stale cell, and why it is stale")
    st.set_defaults(func=_status)

    rm = command("remeasure", "measure chosen kernel cells again: set their rows and stored parts aside "
                              "(under results/replaced/, never deleted), then run `snakemake all`")
    rm.add_argument("rows", nargs="+", help="the cells' row files (results/cells/kernels/...json)")
    rm.add_argument("--parts", nargs="+", default=["time", "memory"], choices=["gate", "time", "memory"],
                    help="which parts to measure again (the rest are taken from the store)")
    rm.add_argument("--directory", "-d", default=".", help="the run directory")
    rm.set_defaults(func=_remeasure)

    chk = command("check", help="correctness gate for every available kernel and mask; "
                                       "exit 1 on a wrong result")
    chk.add_argument("--kernels", nargs="*", default=None, help="default: every kernel available here")
    chk.add_argument("--masks", nargs="*", default=None, help="default: the 14 patterns, block_sparse and the per-head block patterns")
    chk.add_argument("--directions", nargs="*", default=["fwd", "bwd"], choices=["fwd", "bwd"],
                     help="forward, backward or both")
    # Resolved in _check: building the parser must not import torch (run-cell's worker client is light).
    chk.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    chk.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    chk.add_argument("--seqlen", type=int, default=384, help="sequence length of the checked problem")
    chk.add_argument("--heads-q", type=int, default=4, help="query heads")
    chk.add_argument("--heads-kv", type=int, default=2, help="key/value heads (GQA when fewer than query heads)")
    chk.add_argument("--head-dim", type=int, default=64, help="head dimension")
    chk.set_defaults(func=_check)

    pr = command("predict", help="a CP strategy's per-GPU TFLOPs/s at GPU counts not measured, from a "
                                        "measured CP table and the kernel table of the same GPU (a model)")
    pr.add_argument("--cp", required=True, help="a measured cp.parquet (fits the model)")
    pr.add_argument("--kernels", required=True, help="the kernels.parquet of the same GPU model")
    pr.add_argument("--strategies", nargs="+", default=["ring", "allgather", "ulysses", "usp", "double_ring"],
                    help="CP strategies to predict")
    pr.add_argument("--mask", default="causal", help="a mask of the measured tables")
    pr.add_argument("--direction", choices=("fwd", "bwd"), default="fwd", help="forward or backward")
    pr.add_argument("--tokens-per-rank", type=int, default=8192, help="tokens per GPU (the total is this × cp_size)")
    pr.add_argument("--cp-sizes", type=int, nargs="+", default=[8, 16, 32, 64, 96], help="GPU counts to predict")
    pr.add_argument("--gpus-per-node", type=int, default=8, help="GPUs a node holds (rings beyond cross the network)")
    pr.add_argument("--network-gbs", type=float, default=50.0,
                    help="network GB/s per GPU across nodes (default 50: 8 × 400 Gb/s per 8-GPU node)")
    pr.add_argument("--nvlink-gbs", type=float, default=None, help="default: fitted on the measured table")
    pr.set_defaults(func=_predict)

    pl = command("plan", help="how many GPUs a length needs and how fast: per CP strategy, the attention memory "
                              "a GPU holds, whether it fits and the step's time, from measured tables (models)")
    pl.add_argument("--tokens", type=int, default=2**20, help="total sequence length (tokens)")
    pl.add_argument("--mask", default="causal", help="a mask of the measured tables")
    pl.add_argument("--heads-q", type=int, default=64, help="query heads")
    pl.add_argument("--heads-kv", type=int, default=8, help="key/value heads")
    pl.add_argument("--head-dim", type=int, default=128, help="head dimension")
    pl.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"), help="q, k, v dtype")
    pl.add_argument("--gpu", default="H200", help="GPU model (H100, H200, B200): its memory and published tables")
    pl.add_argument("--gpu-memory-gib", type=float, default=None, help="memory a GPU has, GiB (default: the model's)")
    pl.add_argument("--gpus", type=int, nargs="+", default=[8], help="GPU counts to plan for")
    pl.add_argument("--fewest", action="store_true",
                    help="per strategy, the fewest GPUs (a power of two) at which it fits, instead of --gpus")
    pl.add_argument("--fewest-up-to", type=int, default=1024, help="the most GPUs --fewest tries")
    pl.add_argument("--strategies", nargs="+", default=["ring", "allgather", "ulysses", "usp", "double_ring", "magi"],
                    help="CP strategies to plan")
    pl.add_argument("--cp", default=None, help="a measured cp.parquet (default: the GPU model's published one)")
    pl.add_argument("--kernels", default=None,
                    help="the kernels.parquet of the same GPU model (default: the GPU model's published one)")
    pl.set_defaults(func=_plan)

    agg = command("aggregate", help="cell JSON rows -> Parquet table")
    agg.add_argument("--out", required=True, help="the Parquet file to write")
    agg.add_argument("cells", nargs="*", help="cell JSON row files")
    agg.add_argument("--table", choices=("auto", "kernels", "cp"), default="auto",
                     help="the schema (default: by the rows' kind)")
    agg.set_defaults(func=_aggregate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
