"""Put published cells back into a run directory, so a later run measures only what is missing.

    python scripts/restore_cells.py ARCHIVE WORKDIR --measured-at COMMIT \\
        --config config/gpu.yaml [overrides.yaml ...] --measured-with FILE [FILE ...] [--dry-run]

GPU time is what the table costs: a run that stops mid-grid leaves its cells in an archive
(``tar czf cells.tgz results/cells/kernels`` in its run directory), and the next run should go on from
them, measuring only what is missing or what changed.  A cell is three cached parts, each keyed on
its settings and the code it depends on (``longca.execution.cache.parts``): the gate, the timing
and the memory.  An archived row is used only when all of this holds (else it is dropped, with the
reason, counted):

* it was measured at COMMIT: its recorded ``fingerprint`` is what COMMIT's own fingerprint code
  computes for its kernel (COMMIT's ``longca/`` is taken from git and asked, in a subprocess);
* its kernel's library is the one the run has: a key covers LongCA's code, not the library's, so a
  rebuilt library under the same version (``--library-changed KERNEL``) has its gated rows measured
  again;
* its settings are what the given config resolves for that cell now (``longca.config.cell_settings``).
  ``reps`` needs care: an ok row records the count of timed calls made, ``max(reps, what fills
  rep_ms)``, not the setting.  That count equals what the current setting would make when it is the
  current setting itself, or when the run's setting (``timing.reps`` of ``--measured-with``, the
  config files the archived run used) is the current one.

Then each part of the row is put in the run's store (``results/store``, ``longca.execution.cache.store``)
when the code it depends on now was all there at COMMIT, unit by unit (``longca.execution.cache.fingerprint``:
each top-level statement and method by its code lines, wherever it lives): a moved, renamed,
commented or split module keeps its parts, and a part whose code has a statement COMMIT did not
have is measured again.  A row whose parts are all restored (or that never reached them:
``unsupported``, decided by the problem's code and the adapter, not by a library missing on the
machine that ran it) is also written under
WORKDIR/results/cells/kernels/, and ``snakemake <those cells> --touch --forcerun kernel_cell``
records Snakemake's metadata for it, so nothing runs for it; a row with a part to measure again is
left to the run, which takes its other parts from the store.  A cell already in WORKDIR is left alone.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from workflow_config import REPO, resolved

from longca import config as config_mod
from longca import run_dir
from longca.execution.cache import fingerprint
from longca.execution.cache.atomic import write_json_atomic

CELLS = run_dir.KERNEL_CELLS + "/"
# How an adapter's ``available()`` words a machine that cannot run the kernel at all (a library not
# installed, no GPU): such an ``unsupported`` row says nothing of the problem, only of the machine
# it ran on, so it is measured again, never restored (tests/test_restore_cells.py holds every adapter
# to these words).
UNAVAILABLE = (" is not importable", " is not installed", " needs a CUDA")


def package_at(commit: str, dest: Path) -> Path:
    """COMMIT's ``longca/`` package, from git, under ``dest``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "longca"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "longca"


def fingerprints_at(root: Path, kernels: list[str]) -> dict[str, dict]:
    """What the code under ``root`` (a checkout's top) says of each kernel: its own fingerprint and
    the files (relative to its ``longca/``) that fingerprint covers."""
    script = ("import json, sys\n"
              "from longca import kernels\n"
              "try:\n"
              "    from longca.execution.cache import fingerprint as f\n"
              "except ImportError:  # before execution/ had rooms\n"
              "    from longca.execution import fingerprint as f\n"
              "def files(k):\n"
              "    if hasattr(f, 'kernel_files'):\n"
              "        return f.kernel_files(k)\n"
              "    return [f.PACKAGE / p for p in f.MEASUREMENT_CODE] + [kernels.source_file(k)]\n"
              "print(json.dumps({k: {'fingerprint': f.kernel_fingerprint(k),\n"
              "                      'files': [str(p.resolve().relative_to(f.PACKAGE)) for p in files(k)]}\n"
              "                  for k in sys.argv[1:]}))\n")
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", script, *kernels], capture_output=True, text=True, env=env,
                         cwd=root, check=True)
    return json.loads(out.stdout)


def units_at(old_pkg: Path, old_files: list[str]) -> set[str]:
    """The code units of COMMIT's files for a kernel (``old_files`` relative to its ``longca/``)."""
    return set(fingerprint.units(old_pkg / f for f in old_files))


def restorable_parts(kernel: str, then: set[str]) -> dict[str, bool]:
    """Per part, whether every code unit it depends on now was there at COMMIT; and ``problem``:
    whether the code deciding support (the problem's and the adapter's) was."""
    from longca.execution.cache.parts import PARTS

    found = {part: set(fingerprint.units(fingerprint.part_files(part, kernel))) <= then for part in PARTS}
    found["problem"] = set(fingerprint.units(fingerprint.problem_files(kernel))) <= then
    return found


def part_values(row: dict, measured_at: str | None) -> dict[str, dict]:
    """The parts an archived row holds, as the store keeps them (a row written before parts existed
    holds a gate and a timing; its ``peak_mem_bytes`` was the timing harness's, not a memory part)."""
    from longca.execution.measure.timing import Timing

    values = {}
    # A part's provenance is what the row recorded for it; where it recorded none, it stays unknown
    # (null) rather than taking the row's own time or libraries, which may be another part's.
    if "gate_error" in row:
        values["gate"] = {"gate_ok": row["status"] != "wrong", "gate_error": row["gate_error"],
                          "gate_tolerance": row["gate_tolerance"], "gate_detail": row["gate_detail"],
                          "gate_seqlen": row.get("gate_seqlen"), "gate_area": row.get("gate_area"),
                          **{c: row.get(c) for c in ("gate_at", "gate_on", "gate_library")}}
    if row["status"] == "ok":
        timing = {f: row.get(f) for f in Timing.__dataclass_fields__ if f != "peak_mem_bytes"}
        values["time"] = {**timing, "notes": row.get("notes"), "timed_at": row.get("timed_at") or measured_at,
                          "timed_on": row.get("timed_on") or row.get("hostname"),
                          "timed_load_1m": row.get("timed_load_1m"), "timed_library": row.get("timed_library")}
        if "parts_reused" in row:  # measured by the memory part
            values["memory"] = {"peak_mem_bytes": row.get("peak_mem_bytes"),
                                **{c: row.get(c) for c in ("memory_at", "memory_on", "memory_library", "memory_via")}}
    return values


def settings_differ(row: dict, settings: dict, reps_then: int) -> str | None:
    """The first setting the row was not measured with, or None (``reps_then``: the run's setting)."""
    for key, want in settings.items():
        have = row.get(key)
        if key in ("mask_params", "kernel_options"):
            have = json.loads(have) if isinstance(have, str) else have
        if key == "reps" and row.get("status") == "ok":  # the count made: see the module's docstring
            if have is None or have < want or (have != want and reps_then != want):
                return f"reps: {have} timed calls with reps={reps_then} then, reps={want} now"
            continue
        if have != want:
            return f"{key}: {have!r} != {want!r}"
    if "kernel_options" not in settings and json.loads(row.get("kernel_options") or "{}"):
        return "kernel_options: set in the row, not in the config"
    return None


def read_archive(path: Path) -> dict[str, tuple[dict, str]]:
    """Every kernel cell row in the archive, by its path under the run directory, with when its
    file was written (UTC, ISO 8601: the measurement's time for rows that do not record it)."""
    rows = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            name = member.name.removeprefix("./")
            if member.isfile() and name.startswith(CELLS) and name.endswith(".json"):
                written = datetime.fromtimestamp(member.mtime, timezone.utc).isoformat(timespec="seconds")
                rows[name] = (json.load(tar.extractfile(member)), written)
    return rows


def restore(args) -> dict:
    from longca.execution.cache import store as store_mod
    from longca.execution.measure.cell import CellSpec
    from longca.execution.cache.parts import PARTS, part_key, part_settings

    cfg = resolved(*args.config)
    reps_then = resolved(*args.measured_with)["timing"]["reps"]
    cells = {c.path: c for c in config_mod.kernel_cells(cfg)}
    rows = read_archive(args.archive)
    kernels_seen = sorted({r["kernel"] for r, _ in rows.values()})
    with tempfile.TemporaryDirectory() as tmp:
        old_pkg = package_at(args.measured_at, Path(tmp))
        at_commit = fingerprints_at(Path(tmp), kernels_seen)
        then = {k: at_commit[k]["fingerprint"] for k in kernels_seen}
        restorable = {k: restorable_parts(k, units_at(old_pkg, at_commit[k]["files"])) for k in kernels_seen}
    now = {k: fingerprint.kernel_fingerprint(k) for k in kernels_seen}
    store = store_mod.Store(args.workdir / store_mod.DEFAULT)
    whole, parts_put, dropped = {}, collections.Counter(), collections.Counter()
    for path, (row, written) in sorted(rows.items()):
        kernel = row["kernel"]
        cell = cells.get(path)
        if cell is None:
            dropped["not a cell of this config's grid"] += 1
            continue
        if (args.workdir / path).exists():
            dropped["already in the run directory"] += 1
            continue
        if row.get("fingerprint") != then[kernel]:
            dropped[f"not measured at {args.measured_at} (fingerprint)"] += 1
            continue
        settings = config_mod.cell_settings(cfg, cell.kernel, cell.mask, cell.seqlen, cell.direction, cell.dtype)
        if reason := settings_differ(row, settings, reps_then):
            dropped[f"settings differ ({reason.split(':')[0]})"] += 1
            continue
        can = restorable[kernel]
        if row["status"] not in ("ok", "wrong", "unsupported"):  # oom, error, timeout: measure again
            dropped[f"status {row['status']}: measured again"] += 1
            continue
        if kernel in args.library_changed and row["status"] != "unsupported":
            dropped[f"{kernel}: its library changed since: measured again"] += 1
            continue
        if row["status"] == "unsupported":
            if kernel not in args.unavailable_here and any(words in (row.get("reason") or "") for words in UNAVAILABLE):
                dropped[f"{kernel}: unavailable on the machine that ran it: measured again"] += 1
            elif can["problem"]:
                whole[path] = dict(row, fingerprint=now[kernel])
            else:
                dropped[f"{kernel}: support code changed since"] += 1
            continue
        spec = dataclasses.asdict(CellSpec.from_dict(settings))
        values = part_values(row, written)
        needed = ["gate"] if row["status"] == "wrong" else list(PARTS)
        for part, value in values.items():
            if not can[part]:
                continue
            code = fingerprint.part_fingerprint(part, kernel)
            key = part_key(part, spec, code)
            if not args.dry_run:
                store.put(part, key, value, part_settings(part, spec), code)
            parts_put[part] += 1
        if all(can[p] and p in values for p in needed):
            whole[path] = dict(row, fingerprint=now[kernel])
    if not args.dry_run:
        for path, row in whole.items():
            write_json_atomic(row, args.workdir / path)
        if whole:
            record_metadata(args, list(whole))
    return {"archive": len(rows), "whole": len(whole), "parts": dict(parts_put), "dropped": dict(dropped)}


def record_metadata(args, paths: list[str]) -> None:
    """Snakemake's record of the restored cells (their params: settings and fingerprint), made by
    touching them: nothing runs, and a later change to their code or settings reruns them."""
    configs = [str(Path(c).resolve()) for c in args.config]
    # Targets first: --configfile takes every word after it.  The directory absolute: a relative one
    # would be taken from the cwd given below, a run directory nested in itself, whose record a
    # later run in the real one never sees.
    cmd = [sys.executable, "-m", "snakemake", *paths, "-s", str(REPO / "Snakefile"),
           "--directory", str(args.workdir.resolve()), "--cores", "1", "--touch", "--forcerun", "kernel_cell",
           "--configfile", *configs]
    # Touching runs nothing, so it needs no GPU; the workflow still refuses device: cuda where it sees
    # none, so a CPU machine restoring a GPU run's cells names one.
    env = dict(os.environ)
    env.setdefault("CUDA_VISIBLE_DEVICES", "0")
    proc = subprocess.run(cmd, cwd=args.workdir, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"snakemake --touch failed ({proc.returncode}): the rows are written, Snakemake's "
                         f"record of them is not\n{proc.stderr[-3000:]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archive", type=Path, help="a .tgz holding results/cells/kernels/...")
    ap.add_argument("workdir", type=Path, help="the run directory (snakemake --directory)")
    ap.add_argument("--measured-at", required=True, help="the commit the archive's cells were measured at")
    ap.add_argument("--config", nargs="+", required=True, help="the config files the run uses, in order")
    ap.add_argument("--measured-with", nargs="+", required=True,
                    help="the config files the archived run used (its timing.reps is read: see above)")
    ap.add_argument("--unavailable-here", nargs="+", default=[], metavar="KERNEL",
                    help="kernels the run's machine cannot run either: their archived 'unavailable' rows are "
                         "restored, not measured again")
    ap.add_argument("--library-changed", nargs="+", default=[], metavar="KERNEL",
                    help="kernels whose library is another build or version than the archive's (a cache key "
                         "covers LongCA's code, not the library's): their gated rows are measured again; "
                         "an unsupported row (the mask, decided by LongCA's code) is still restored")
    ap.add_argument("--dry-run", action="store_true", help="say what would be kept; write nothing")
    args = ap.parse_args(argv)
    if not args.archive.is_file():
        ap.error(f"{args.archive}: no such archive")
    from longca import kernels

    if unknown := sorted(set(args.unavailable_here + args.library_changed) - set(kernels.names())):
        ap.error(f"unknown kernel {', '.join(unknown)}; known: {', '.join(kernels.names())}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    summary = restore(args)
    print(f"{summary['whole']} of {summary['archive']} cells restored whole into {args.workdir}"
          + (" (dry run: nothing written)" if args.dry_run else ""))
    print("parts put in the store: " + (", ".join(f"{p} {n}" for p, n in sorted(summary["parts"].items()))
                                        or "none") + " (a cell not restored whole measures only its other parts)")
    for reason, n in sorted(summary["dropped"].items(), key=lambda kv: -kv[1]):
        print(f"  dropped {n}: {reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
