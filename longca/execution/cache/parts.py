"""A kernel cell's three measurements, each cached on its own key: correctness, time and memory.

Each part is determined by the problem (its settings and code), the kernel's adapter, and its own
settings and code, listed here.  Its key (``part_key``) hashes exactly those, so fixing the gate
re-runs gates and re-times nothing, a new memory probe measures memory only, and a change to the
timing harness re-times without re-gating.  ``longca.execution.cache.store`` keeps the parts;
``longca.execution.measure.cell.run_cell`` measures only the parts it does not find there.

Free of heavy imports: the Snakefile computes fingerprints from it without importing torch.  Kept
in the cache room, under what is measured: ``fingerprint`` reads the parts' code from it and
``longca.execution.measure.cell`` their keys.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

from ... import problem_settings, timing_spec

# Settings every part depends on: the problem (longca.spec) and the kernel that solves it.
PROBLEM_SETTINGS = ("kernel", "kernel_options", *problem_settings.names())
# Code every part depends on (relative to the package): masks, the problem, its FLOPs and the kernel
# base class.  The kernel's own adapter is added per kernel.  Not the registry that finds the adapter
# (``REGISTRIES``): it computes nothing, and the adapter it returns is in the key.
PROBLEM_CODE = ("attention/errors.py", "attention/masks/__init__.py", "attention/masks/slices.py",
                "attention/masks/_checks.py", "attention/masks/_shapes.py", "attention/masks/patterns.py",
                "attention/masks/custom.py", "attention/masks/block_sparse.py",
                "attention/varlen.py", "attention/mask_convert.py", "attention/problem.py",
                "attention/flops.py", "attention/data/doclen_default.json", "spec.py",
                "kernels/base.py")
# Name -> member lookup (longca/registry.py): imported by measuring code, in no key.
REGISTRIES = ("registry.py", "kernels/__init__.py")


@dataclass(frozen=True)
class Part:
    name: str
    settings: tuple[str, ...]   # besides PROBLEM_SETTINGS
    code: tuple[str, ...]       # besides PROBLEM_CODE and the adapter


PARTS: dict[str, Part] = {p.name: p for p in (
    Part("gate", ("gate_seqlen",),
         ("attention/reference.py", "attention/masks/gate.py", "execution/measure/gate.py")),
    Part("time", timing_spec.names(),
         ("execution/measure/timing.py", "execution/measure/graphed.py", "execution/measure/timed.py",
          "execution/measure/call_memory.py")),
    # Read off the timing's own calls where it can be (call_memory.CallReading, in timed.py): the
    # timing's code is the memory's too.
    Part("memory", (),
         ("execution/measure/memory.py", "execution/measure/call_memory.py", "execution/measure/timing.py",
          "execution/measure/graphed.py", "execution/measure/timed.py")),
)}


def part_settings(part: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings ``part`` depends on, from a cell spec's fields (``dataclasses.asdict(spec)``)."""
    names = PROBLEM_SETTINGS + PARTS[part].settings
    # settled: an unset (or equal) head_dim_v keys nothing, as before it existed.
    return problem_settings.settled({name: settings[name] for name in names if name in settings})


def part_key(part: str, settings: Mapping[str, Any], fingerprint: str) -> str:
    """A part's cache key: its settings and the fingerprint of its code."""
    # Through JSON, so that tuples and lists, ints and floats key alike as they were written.
    blob = json.dumps({"part": part, "settings": part_settings(part, settings), "code": fingerprint},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]
