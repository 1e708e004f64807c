"""Put published cells back into a run directory, so a later run measures only what is missing.

    python benchmarks/restore_cells.py ARCHIVE WORKDIR --measured-at COMMIT \\
        --config config/gpu.yaml [overrides.yaml ...] --measured-with FILE [FILE ...] [--dry-run]

GPU time is what the table costs: a lease that ends mid-grid leaves its cells in an archive
(docs/results/*/cells.tgz, docs/data/*/workflow_cells.tgz), and the next lease should go on from
them.  A cell's cache key is its settings and the fingerprint of the code that computed it, so a
cell is kept only when all of this holds, and dropped (with the reason, counted) otherwise:

* it was measured at COMMIT: its recorded ``fingerprint`` is what COMMIT's own fingerprint code
  computes for its kernel (COMMIT's ``longca/`` is taken from git and asked, in a subprocess);
* the code that computes it has not changed since: the fingerprint the current code gives
  COMMIT's files for that kernel (``longca.execution.fingerprint``: code lines only, whatever the
  files are called or where they are) is the current fingerprint, so a moved, renamed, commented or
  documented file keeps its cells, and a cell whose code differs in any statement is measured again;
* its settings are what the given config resolves for that cell now (``longca.config.cell_settings``).
  ``reps`` needs care: an ok row records the count of timed calls made, ``max(reps, what fills
  rep_ms)``, not the setting.  That count equals what the current setting would make when it is the
  current setting itself, or when the run's setting (``timing.reps`` of ``--measured-with``, the
  config files the archived run used) is the current one.

Kept rows get the current fingerprint (it differs from COMMIT's only when a docstring, a comment or
the fingerprint's own file list changed) and are written under WORKDIR/results/cells/kernels/;
then ``snakemake <those cells> --touch --forcerun kernel_cell`` records Snakemake's metadata for them
without running anything, so a later change to their code or settings reruns them as usual.  A cell
already in WORKDIR is left alone.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The workflow's default config, which Snakemake reads before any --configfile.
WORKFLOW_CONFIG = REPO / "config" / "config.yaml"
sys.path.insert(0, str(REPO))

from longca import config as config_mod  # noqa: E402
from longca.execution import fingerprint  # noqa: E402
from longca.execution.atomic import write_json_atomic  # noqa: E402

CELLS = "results/cells/kernels/"


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
              "from longca.execution import fingerprint as f\n"
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


def changed_files(old_pkg: Path, old_files: list[str], kernel: str) -> list[str]:
    """The kernel's current files (relative to longca/) whose code is in none of COMMIT's files for
    it, and COMMIT's files whose code is in none of the current ones; empty when the code is the same."""
    now = {str(p.resolve().relative_to(fingerprint.PACKAGE)): fingerprint.file_digest(p.resolve())
           for p in fingerprint.kernel_files(kernel) if p.exists()}
    then = {f: fingerprint.file_digest((old_pkg / f).resolve()) for f in old_files if (old_pkg / f).exists()}
    return ([f for f, d in now.items() if d not in then.values()]
            + [f"{f} (at the commit)" for f, d in then.items() if d not in now.values()])


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


def read_archive(path: Path) -> dict[str, dict]:
    """Every kernel cell row in the archive, by its path under the run directory."""
    rows = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            name = member.name.removeprefix("./")
            if member.isfile() and name.startswith(CELLS) and name.endswith(".json"):
                rows[name] = json.load(tar.extractfile(member))
    return rows


def restore(args) -> dict:
    cfg = config_mod.validate(config_mod.merge_files([WORKFLOW_CONFIG, *args.config]))
    reps_then = config_mod.validate(config_mod.merge_files([WORKFLOW_CONFIG, *args.measured_with]))["timing"]["reps"]
    cells = {c.path: c for c in config_mod.kernel_cells(cfg)}
    rows = read_archive(args.archive)
    kernels_seen = sorted({r["kernel"] for r in rows.values()})
    with tempfile.TemporaryDirectory() as tmp:
        old_pkg = package_at(args.measured_at, Path(tmp))
        at_commit = fingerprints_at(Path(tmp), kernels_seen)
        then = {k: at_commit[k]["fingerprint"] for k in kernels_seen}
        changed = {k: changed_files(old_pkg, at_commit[k]["files"], k) for k in kernels_seen}
    now = {k: fingerprint.kernel_fingerprint(k) for k in kernels_seen}
    kept, dropped = {}, collections.Counter()
    for path, row in sorted(rows.items()):
        kernel = row["kernel"]
        cell = cells.get(path)
        if cell is None:
            dropped["not a cell of this config's grid"] += 1
        elif (args.workdir / path).exists():
            dropped["already in the run directory"] += 1
        elif row.get("fingerprint") != then[kernel]:
            dropped[f"not measured at {args.measured_at} (fingerprint)"] += 1
        elif changed[kernel]:
            dropped[f"{kernel}: code changed since ({', '.join(changed[kernel])})"] += 1
        elif reason := settings_differ(row, config_mod.cell_settings(cfg, cell.kernel, cell.mask, cell.seqlen,
                                                                      cell.direction, cell.dtype), reps_then):
            dropped[f"settings differ ({reason.split(':')[0]})"] += 1
        else:
            kept[path] = dict(row, fingerprint=now[kernel])
    if not args.dry_run:
        for path, row in kept.items():
            write_json_atomic(row, args.workdir / path)
        if kept:
            record_metadata(args, list(kept))
    return {"archive": len(rows), "kept": len(kept), "dropped": dict(dropped)}


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
    ap.add_argument("--dry-run", action="store_true", help="say what would be kept; write nothing")
    args = ap.parse_args(argv)
    if not args.archive.is_file():
        ap.error(f"{args.archive}: no such archive")
    args.workdir.mkdir(parents=True, exist_ok=True)
    summary = restore(args)
    print(f"{summary['kept']} of {summary['archive']} cells restored into {args.workdir}"
          + (" (dry run: nothing written)" if args.dry_run else ""))
    for reason, n in sorted(summary["dropped"].items(), key=lambda kv: -kv[1]):
        print(f"  dropped {n}: {reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
