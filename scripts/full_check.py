"""The full-size check over a grid: every kernel × mask × direction once at one long length.

    python scripts/full_check.py OUTDIR --budget-s 600 [--configfile config/gpu.yaml [config/sparse.yaml]] \\
        [--seqlen 8192] [--kernels K ...] [--masks M ...]

Each check (``longca.execution.measure.full_check``) compares the kernel's output, and for backward
dq, dk, dv, with exact attention computed in float32 block by block, at ``--seqlen`` tokens with the
config's shapes and dtype, within the correctness gate's tolerances.  Each result is kept as
``OUTDIR/checks/<kernel>/<mask>/<dtype>_<direction>_<seqlen>.json`` with the settings and the code
fingerprint it was measured with; a second run skips the checks whose settings and code are the
same, and measures only what is missing or changed (and `unsupported` rows: a library installed
since turns them into checks).  ``OUTDIR/summary.md`` has one line per check.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path
from typing import Callable

from workflow_config import REPO, resolved

from longca import config as longca_config
from longca.execution.cache import fingerprint
from longca.execution.cache.atomic import write_json_atomic

CHECK_CODE = ("attention/chunked_reference.py", "execution/measure/full_check.py", "execution/measure/gate.py")


def check_fingerprint(kernel: str) -> str:
    return fingerprint.files_fingerprint(fingerprint.problem_files(kernel, CHECK_CODE))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir", type=Path)
    p.add_argument("--budget-s", type=float, required=True, help="start no check after this many seconds")
    p.add_argument("--configfile", type=Path, nargs="+", default=[REPO / "config" / "gpu.yaml"],
                   help="the config files a run gives, in order (e.g. config/gpu.yaml config/sparse.yaml)")
    p.add_argument("--seqlen", type=int, default=8192)
    p.add_argument("--kernels", nargs="+", help="default: the config's")
    p.add_argument("--masks", nargs="+", help="default: the config's")
    return p.parse_args(argv)


def checked(row: dict, check: Callable[[], dict]) -> dict:
    """``row`` completed by ``check()``: status ok or wrong with its ``error``, ``tolerance`` and
    ``detail`` (and whatever else it returns), or unsupported, oom or error with the reason; its wall."""
    import torch

    from longca.execution.measure.cell import is_oom
    from longca.kernels.base import Unsupported

    started = time.monotonic()
    try:
        result = check()
        row.update(status="ok" if result.pop("ok") else "wrong", **result)
    except Unsupported as exc:
        row.update(status="unsupported", reason=str(exc))
    except Exception as exc:  # noqa: BLE001 — a row per check, whatever happens
        row.update(status="oom" if is_oom(exc) else "error",
                   reason="".join(traceback.format_exception_only(type(exc), exc)).strip())
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    row["wall_s"] = time.monotonic() - started
    return row


def write_summary(rows: list[dict], keys: list[str], path: Path) -> str:
    """One table line per check (``keys``, then status, worst error, tolerance) at ``path``; returns
    the count per status, e.g. "7 ok, 1 wrong"."""
    lines = ["| " + " | ".join(keys + ["status", "worst error", "tolerance"]) + " |",
             "| " + " | ".join(["---"] * (len(keys) + 3)) + " |"]
    for r in rows:
        err = f"{r['error']:.2e}" if r.get("error") is not None else "–"
        tol = f"{r['tolerance']:.0e}" if r.get("tolerance") is not None else "–"
        lines.append("| " + " | ".join([str(r[k]) for k in keys] + [r["status"], err, tol]) + " |")
    path.write_text("\n".join(lines) + "\n")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


def one_check(settings: dict) -> dict:
    """The check's result row: status ok, wrong, unsupported, oom or error, with the errors."""
    from longca import kernels
    from longca.attention import masks
    from longca.execution.measure.cell import CellSpec
    from longca.execution.measure.full_check import full_size_check
    from longca.kernels.base import Unsupported

    spec = CellSpec.from_dict(settings)
    row = {"kernel": spec.kernel, "mask": spec.mask, "direction": spec.direction, "dtype": spec.dtype,
           "seqlen": spec.seqlen, "status": "error", "reason": None}

    def check() -> dict:
        kernel = kernels.get(spec.kernel).with_options(spec.kernel_options)
        problem = spec.problem()
        reason = masks.kernel_takes(kernel, problem.mask) or kernel.supports(problem)
        if reason:
            raise Unsupported(reason)
        return {**full_size_check(kernel, problem), "area": problem.mask.area()}

    return checked(row, check)


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = resolved(*args.configfile)
    from longca import kernels

    config_masks = [e.name for e in longca_config.mask_entries(cfg)]
    kernel_names, mask_names = args.kernels or cfg["kernels"], args.masks or config_masks
    unknown = [f"--kernels {k}" for k in kernel_names if k not in kernels.names()] + \
              [f"--masks {m} (not a mask of {' '.join(map(str, args.configfile))})" for m in mask_names
               if m not in config_masks]
    if unknown:
        raise SystemExit(f"full_check.py: unknown {', '.join(unknown)}")
    args.outdir.mkdir(parents=True, exist_ok=True)
    started, rows = time.monotonic(), []
    dtype = cfg["dtypes"][0]
    for kernel in kernel_names:
        code = check_fingerprint(kernel)
        for mask in mask_names:
            for direction in cfg["directions"]:
                settings = longca_config.cell_settings(cfg, kernel, mask, args.seqlen, direction, dtype)
                path = args.outdir / "checks" / kernel / mask / f"{dtype}_{direction}_{args.seqlen}.json"
                kept = json.loads(path.read_text()) if path.exists() else None
                # an `unsupported` row is checked again: it costs nothing, and the kernel's library
                # may have been installed since (its row then said "not importable")
                if kept and kept.get("settings") == json.loads(json.dumps(settings)) and kept.get("code") == code \
                        and kept["row"]["status"] != "unsupported":
                    rows.append(kept["row"])
                    continue
                if time.monotonic() - started > args.budget_s:
                    continue
                row = one_check(settings)
                write_json_atomic({"settings": settings, "code": code, "row": row}, path)
                rows.append(row)
                print(f"{kernel}/{mask}/{direction}: {row['status']} {row.get('detail') or row.get('reason') or ''}"[:240],
                      flush=True)
    counts = write_summary(rows, ["kernel", "mask", "direction", "seqlen"], args.outdir / "summary.md")
    print(f"{len(rows)} checks: {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
