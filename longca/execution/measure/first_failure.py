"""Which rank of a CP cell failed first: what a failed CP row names.

When one rank fails, the others usually fail after it, because of it: a collective whose partner
is gone raises ("Connection closed by peer") or waits out its timeout, and torchrun stops the rest.
Rank 0 writes the row, so without this the row named rank 0's own, later failure.  torchrun's agent
names the first failure it saw ("Root Cause (first observed failure)"), but an agent sees only the
ranks of its own node, and a rank whose exception the cell caught exits 0.

So every rank records its own first failure (``Recorder``), the moment it happens, as one JSON file
in the cell's failure folder (beside the row: on the shared filesystem across nodes): rank, host,
pid, the exception's type and message, whether the process group was up yet, and the wall time.
The launcher then names the earliest over all ranks (``summary``).  A rank that died without a
Python exception (killed, a segfault) leaves no record; it is known from torchrun's own failure
report in the log (``torchrun_failures``), to the second.  Torch-free: the launcher imports it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from ..cache.atomic import write_json_atomic

# How long the message of a failure that followed the first one may be, in the row's reason.
OTHER_CHARS = 160
# A failure known only from torchrun is known to the second, when its agent noticed it: it counts
# as up to this long before that second (a rank's own record is exact; torchrun polls every 0.1 s).
TORCHRUN_SLACK_S = 1.0
# torchrun's agent stops the ranks left after a failure with SIGTERM: those are not failures of
# their own unless nothing else failed.
TEARDOWN_EXIT = -15


@dataclass(frozen=True)
class Failure:
    rank: int | None
    host: str
    status: str               # the row status this failure alone would give: error, timeout, oom, unsupported
    type: str                 # the exception's type, or "died" (no Python exception: torchrun's report)
    message: str
    time: float               # seconds since the epoch (each host's clock)
    stage: str = "cell"       # "start": before the process group was up; "cell": measuring
    pid: int | None = None
    source: str = "rank"      # "rank": its own record; "torchrun": its agent's report
    exitcode: int | None = None  # torchrun's report: the process's exit status (-N: signal N)

    @property
    def order(self) -> float:
        return self.time - (TORCHRUN_SLACK_S if self.source == "torchrun" else 0.0)

    def text(self) -> str:
        return self.message if self.type == "died" else f"{self.type}: {self.message}" if self.message else self.type


def folder_for(out: str | os.PathLike) -> Path:
    """Where the ranks of the cell whose row goes to ``out`` record their failures (absolute: a
    resident group's ranks need not run where the launcher does)."""
    return Path(f"{out}.failures").absolute()


def fresh(folder: str | os.PathLike) -> Path:
    """An empty failure folder (an earlier run's records must not pass for this one's)."""
    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Recorder:
    """One rank's first failure, written to ``folder`` the moment it is noted (later ones on the
    same rank are its consequences and are not written).  No folder: records nothing."""

    def __init__(self, folder: str | os.PathLike | None, rank: int | None = None):
        self.folder = Path(folder) if folder else None
        self.rank = rank if rank is not None else _env_rank()
        self.noted: Failure | None = None

    def note(self, status: str, exc: BaseException, *, stage: str = "cell") -> None:
        if self.noted is not None or self.folder is None:
            return
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        prefix = f"{type(exc).__module__}.{type(exc).__qualname__}"
        for name in (prefix, type(exc).__qualname__):
            if text.startswith(name + ":") or text == name:
                text = text[len(name):].removeprefix(":").strip()
                break
        if status == "oom":  # as the row has it: the allocator's report runs to many lines
            text = text.splitlines()[0] if text else text
        self.noted = Failure(rank=self.rank, host=socket.gethostname(), status=status, type=type(exc).__name__,
                             message=text, time=time.time(), stage=stage, pid=os.getpid())
        try:
            write_json_atomic(asdict(self.noted), self.folder / f"rank{self.rank}.json")
        except OSError:  # the row must still come out; the launcher falls back to torchrun's report
            pass


def _env_rank() -> int | None:
    rank = os.environ.get("RANK")
    return int(rank) if rank and rank.lstrip("-").isdigit() else None


def recorded(folder: str | os.PathLike) -> list[Failure]:
    """The failures the ranks recorded in ``folder``."""
    failures = []
    for path in sorted(Path(folder).glob("rank*.json")) if Path(folder).is_dir() else ():
        try:
            failures.append(Failure(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return failures


# One failure of torchrun's report (torch.distributed.elastic's ChildFailedError), e.g.
#   [0]:
#     time      : 2025-01-01_12:34:56
#     host      : node2
#     rank      : 3 (local_rank: 1)
#     exitcode  : -9 (pid: 4242)  (SIGKILL)
#     error_file: <N/A>
#     traceback : Signal 9 (SIGKILL) received by PID 4242
_TORCHRUN_FAILURE = re.compile(
    r"time\s*:\s*(?P<time>\S+)\s*\n\s*host\s*:\s*(?P<host>\S+)\s*\n"
    r"\s*rank\s*:\s*(?P<rank>-?\d+)\s*\(local_rank:\s*-?\d+\)\s*\n"
    r"\s*exitcode\s*:\s*(?P<code>-?\d+)\s*\(pid:\s*(?P<pid>\d+)\)\s*(?:\((?P<signal>\w+)\))?[ \t]*\n"
    r"\s*error_file\s*:.*\n\s*traceback\s*:\s*(?P<traceback>.*)")


def torchrun_failures(log: str) -> list[Failure]:
    """The failed ranks torchrun's agents reported in ``log`` (every node's agent, each rank once,
    at the earliest time reported)."""
    found: dict[int, Failure] = {}
    for m in _TORCHRUN_FAILURE.finditer(log or ""):
        try:
            when = datetime.strptime(m["time"], "%Y-%m-%d_%H:%M:%S").timestamp()
        except ValueError:
            continue
        rank, code = int(m["rank"]), int(m["code"])
        how = m["traceback"].strip()
        if not how.startswith("Signal"):
            how = f"exited with status {code}" + (f" ({m['signal']})" if m["signal"] else "")
        how += ", without a Python exception (killed or crashed: torchrun's report)"
        failure = Failure(rank=rank, host=m["host"], status="error", type="died", message=how, time=when,
                          stage="cell", pid=int(m["pid"]), source="torchrun", exitcode=code)
        if rank not in found or failure.time < found[rank].time:
            found[rank] = failure
    return list(found.values())


def combined(records: list[Failure], reported: list[Failure]) -> list[Failure]:
    """Every failed rank once, earliest first: a rank's own record over torchrun's report of it;
    ranks torchrun stopped (SIGTERM) only when nothing else failed."""
    mine = {f.rank for f in records}
    others = [f for f in reported if f.rank not in mine]
    failures = records + [f for f in others if f.exitcode != TEARDOWN_EXIT] or others
    return sorted(failures, key=lambda f: (f.order, f.rank if f.rank is not None else -1))


def _when(t: float) -> str:
    return datetime.fromtimestamp(t).isoformat(sep=" ", timespec="milliseconds")


def _short(text: str, limit: int = OTHER_CHARS) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def summary(failures: list[Failure], *, context: str | None = None, log: str | None = None) -> tuple[str, str] | None:
    """``(status, reason)`` naming the first of ``failures`` (sorted by ``combined``) and the ranks
    that failed after it; None without failures.  The status is the first failure's own.
    ``context``: what the launcher saw; ``log``: where every rank's output is."""
    if not failures:
        return None
    first, after = failures[0], failures[1:]
    where = f"rank {first.rank if first.rank is not None else '?'} (host {first.host}, {_when(first.time)}"
    where += ", to the second, as torchrun saw it)" if first.source == "torchrun" else ")"
    stage = " before the process group was up" if first.stage == "start" else ""
    parts = [f"first failure: {where}{stage}: {first.text()}"]
    if after:
        n = len(after)
        parts.append(f"{n} other rank{'s' if n > 1 else ''} failed after it: " + ", ".join(
            f"rank {f.rank} ({'the same' if f.text() == first.text() else _short(f.text())})" for f in after))
    else:
        parts.append("no other rank failed")
    parts += [context] if context else []
    parts += [f"every rank's output: {log}"] if log else []
    return first.status, "; ".join(parts)


# Row statuses a rank's failure may replace: a verdict every rank agreed on (ok, wrong, unsupported)
# is the cell's answer and stays.
REPLACEABLE = frozenset({"error", "timeout", "oom"})


def name_first(row: dict, failures: list[Failure], *, log: str | None = None, context: str | None = None) -> dict:
    """``row`` with its status and reason from the first failure, when it failed (``REPLACEABLE``)
    and any rank recorded or was reported failing.  ``context``: what the launcher saw (the job was
    killed at its limit, torchrun's exit status), kept after the first failure."""
    if row.get("status") not in REPLACEABLE:
        return row
    named = summary(failures, context=context, log=log)
    if named is None:
        return row
    status, reason = named
    return {**row, "status": status, "reason": reason}
