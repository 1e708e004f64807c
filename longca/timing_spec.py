"""How a cell is timed, defined once: warm-up, repetitions, their time budgets and graph replay.

Config (``timing:`` over the device's defaults, ``longca.config``) resolves to these fields; a
cell's settings, its timing part's cache key (``longca.execution.cache.parts``), its row and the
Parquet columns carry them under these names; the harness (``longca.execution.measure.timed``)
takes them.  A CP cell is timed by counts, a warm-up duration and graph replay only
(``CountedTiming``): its ranks must make the same calls, so none may stop warming up on its own.  Torch-free: the config and the
thin ``run-cell`` client use it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping


def _setting(default: Any, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True, kw_only=True)
class CountedTiming:
    warmup: int = _setting(2, "warm-up calls, at least")
    warmup_ms: float = _setting(0.0, "and warm up for at least this many ms (GPU clocks settle)")
    reps: int = _setting(5, "timed calls, at least")
    cuda_graph: bool = _setting(False, "CUDA: time replays of the call captured in a graph")


@dataclass(frozen=True, kw_only=True)
class TimingSpec(CountedTiming):
    warmup_max_ms: float = _setting(0.0, "> 0: warm up until steady, at most this many ms")
    rep_ms: float = _setting(0.0, "> 0: repeat until this many ms are filled, at least the reps")

    def harness_args(self) -> dict[str, Any]:
        """The keyword arguments of ``longca.execution.measure.timed.time_kernel``."""
        return dataclasses.asdict(self)


def names(kind: type = TimingSpec) -> tuple[str, ...]:
    """The timing fields of ``kind``, in order."""
    return tuple(f.name for f in dataclasses.fields(kind))


def add_flags(parser, kind: type = TimingSpec, **defaults: Any) -> None:
    """Command-line flags for ``kind``'s fields (``--warmup-ms``; a boolean as a switch), with the
    fields' defaults unless ``defaults`` names others."""
    for f in dataclasses.fields(kind):
        default = defaults.get(f.name, f.default)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            parser.add_argument(flag, action="store_true", default=default, help=f.metadata["help"])
        else:
            parser.add_argument(flag, type=type(f.default), default=default, help=f.metadata["help"])


def own_fields(kind: type) -> list[dataclasses.Field]:
    """The fields ``kind`` adds to its base (TimingSpec: what a CP cell's timing lacks)."""
    inherited = {f.name for base in kind.__bases__ if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)}
    return [f for f in dataclasses.fields(kind) if f.name not in inherited]


def of(settings: Mapping[str, Any], kind: type = TimingSpec):
    """The timing a cell's settings (or row, or spec's fields) hold; absent fields take defaults."""
    return kind(**{name: settings[name] for name in names(kind) if name in settings})


# Time budgets: in a cell's settings only when set, so that a cell timed by counts alone (a CPU
# cell) keeps the cache key it had before time-based timing existed.
BUDGETS = ("warmup_ms", "warmup_max_ms", "rep_ms")


def kernel_settings(timing: Mapping[str, Any]) -> dict[str, Any]:
    """A kernel cell's timing settings from a resolved config's ``timing``: the counts always, each
    budget and graph replay only when set."""
    settings = {"warmup": timing["warmup"], "reps": timing["reps"]}
    settings.update({key: float(timing[key]) for key in BUDGETS if timing.get(key)})
    if timing.get("cuda_graph"):
        settings["cuda_graph"] = True
    return settings


def cp_settings(timing: Mapping[str, Any]) -> dict[str, Any]:
    """A CP cell's timing settings: the counts, a warm-up as long as a kernel cell's may last
    (``warmup_max_ms``, else ``warmup_ms``) and graph replay, each only when set."""
    settings = {"warmup": timing["warmup"], "reps": timing["reps"]}
    ms = timing.get("warmup_max_ms") or timing.get("warmup_ms") or 0
    if ms:
        settings["warmup_ms"] = float(ms)
    if timing.get("cuda_graph"):
        settings["cuda_graph"] = True
    return settings
