"""``longca status``: which cells of the configured grid are cached, missing or stale, and why.

The answer is Snakemake's own: its ``--summary`` lists every output of the grid with its state (a
cell is stale when Snakemake would rerun it), and for the stale ones its dry run's ``reason:`` line
says which params changed.  A cell's params are its resolved settings and its code's fingerprint
(workflow/rules/kernels.smk, cp.smk), so a changed JSON object means the settings changed and a
changed hex string means the code did.  Nothing here re-derives the grid or the cache keys.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from . import config as longca_config
from . import run_dir

CELL_RULES = {"kernel_cell": "kernel", "cp_cell": "cp"}
STATES = ("cached", "missing", "stale", "unreadable")
_CELL_DIR = re.compile(rf"^(?:{re.escape(run_dir.KERNEL_CELLS)}|{re.escape(run_dir.CP_CELLS)})/")
# A dry run's job block: its output, then (a few lines on) why it runs.
_JOB = re.compile(rf"^\s*output: ({re.escape(run_dir.CELLS)}/\S+\.json)\n(?:\s+\w+:.*\n)*?\s*reason: (.*)$", re.M)
_PARAMS = re.compile(r"Params have changed since last execution: .*?before: (.*?) now: (.*?)\s*$")
_REPR = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


@dataclass
class Cell:
    path: str
    kind: str             # kernel, cp
    state: str            # cached, missing, stale, unreadable (a row file that holds no JSON object)
    why: str = ""         # for a stale cell: settings changed (which keys), code changed, or Snakemake's words

    @property
    def name(self) -> str:
        """The cell's name, as tables and logs give it (``kernel/mask/dtype_direction_seqlen``)."""
        return _CELL_DIR.sub("", self.path).removesuffix(".json")


@dataclass
class Status:
    cells: list[Cell] = field(default_factory=list)

    def count(self, state: str, kind: str | None = None) -> int:
        return sum(1 for c in self.cells if c.state == state and kind in (None, c.kind))


def snakemake_command(*args: str, snakefile: str | Path, configfiles: list[str], directory: str | None,
                      config: list[str]) -> list[str]:
    # Targets and flags first: --configfile and --config take every word after them.
    cmd = [sys.executable, "-m", "snakemake", "all", *args, "-s", str(snakefile), "--cores", "1"]
    if directory:
        cmd += ["--directory", directory]
    if configfiles:
        cmd += ["--configfile", *configfiles]
    if config:
        cmd += ["--config", *config]
    return cmd


def _run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"snakemake failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    return proc.stdout


def parse_summary(text: str) -> list[Cell]:
    """The cells of ``snakemake --summary``'s table (output, date, rule, log, status, plan)."""
    cells = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 6 or parts[2] not in CELL_RULES:
            continue
        path, _, rule, _, status, plan = parts
        if status == "missing":
            cells.append(Cell(path, CELL_RULES[rule], "missing"))
        elif plan == "no update":
            cells.append(Cell(path, CELL_RULES[rule], "cached"))
        else:
            cells.append(Cell(path, CELL_RULES[rule], "stale", status))
    return cells


def _values(text: str) -> list[str]:
    return [ast.literal_eval(token) for token in _REPR.findall(text)]


def why_stale(reason: str) -> str:
    """A dry run's reason for a cell in words: which settings changed (``reps 2 → 3``), or that its
    code did, or Snakemake's own reason when it is neither."""
    m = _PARAMS.search(reason)
    if not m:
        return reason
    before, now = _values(m.group(1)), _values(m.group(2))
    settings = [[json.loads(v) for v in values if v.startswith("{")] for values in (before, now)]
    out = []
    if all(settings):
        old, new = settings[0][0], settings[1][0]
        changed = [f"{k} {json.dumps(old.get(k))} → {json.dumps(new.get(k))}"
                   for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        out.append("settings changed: " + ", ".join(changed))
    if any(not v.startswith("{") for v in before + now):
        out.append("code changed")
    return "; ".join(out) or reason


def status(snakefile: str | Path, *, configfiles: list[str] = (), directory: str | None = None,
           config: list[str] = ()) -> Status:
    """The cells of the grid ``snakefile`` plans with these configs, each cached, missing, stale or
    unreadable (Snakemake's own summary and dry run)."""
    for path in configfiles:  # a YAML error named with its file and line (Snakemake names neither)
        longca_config.load_yaml(path)
    common = {"snakefile": snakefile, "configfiles": list(configfiles), "directory": directory, "config": list(config)}
    cells = parse_summary(_run(snakemake_command("--summary", **common)))
    stale = {c.path: c for c in cells if c.state == "stale"}
    if stale:
        for path, reason in _JOB.findall(_run(snakemake_command("-n", **common))):
            if path in stale:
                stale[path].why = why_stale(reason)
    for cell in cells:
        if cell.state == "cached" and not _readable(Path(directory or ".") / cell.path):
            cell.state, cell.why = "unreadable", ("holds no JSON object: `longca remeasure` it, then `snakemake all` "
                                                  "writes it again")
    return Status(cells)


def _readable(path: Path) -> bool:
    """Whether a row file holds a JSON object (Snakemake counts any file as done)."""
    try:
        return isinstance(json.loads(path.read_text()), dict)
    except (OSError, ValueError):
        return False


def format_status(result: Status, *, listing: bool = False) -> str:
    kinds = [k for k in ("kernel", "cp") if any(c.kind == k for c in result.cells)] or ["kernel"]
    width = max(map(len, STATES)) + 1
    lines = [f"{'cells':{width}s}" + "".join(f"{k:>8s}" for k in kinds)]
    for state in STATES:
        lines.append(f"{state:{width}s}" + "".join(f"{result.count(state, k):8d}" for k in kinds))
    # Per cause ("settings changed", "code changed", or Snakemake's words), each counted once per cell.
    causes = Counter(part.split(":")[0] for c in result.cells if c.state == "stale" for part in c.why.split("; "))
    if causes:
        lines.append("stale: " + ", ".join(f"{cause} {n}" for cause, n in causes.items()))
    todo = [c for c in result.cells if c.state != "cached"]
    if listing and todo:
        lines += [""] + [f"{c.state:{width}s}{c.kind:8s}{c.name}" + (f"  ({c.why})" if c.why else "") for c in todo]
    elif todo:
        lines.append("(longca status --list names them; `snakemake all` measures the missing and stale, "
                     "`longca remeasure FILE...` sets unreadable or noisy ones aside first)")
    return "\n".join(lines)
