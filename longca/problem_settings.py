"""The problem's settings as config, flags and cache keys take them: derived from
``longca.spec.ProblemSpec``'s fields, so a new field reaches each of them from there.  Torch-free."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from .spec import DIRECTIONS, ProblemSpec


def names() -> tuple[str, ...]:
    """The problem's fields, in order."""
    return tuple(f.name for f in dataclasses.fields(ProblemSpec))


def settled(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` without ``head_dim_v`` where it says nothing (unset, or equal to ``head_dim``):
    a cell of one head dim for q, k and v has the settings, name and cache key it had before the
    value head dim existed, however it was spelt."""
    out = dict(settings)
    if "head_dim_v" in out and out["head_dim_v"] in (None, out.get("head_dim")):
        del out["head_dim_v"]
    return out


def grid_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The problem fields a resolved config holds once for every cell of its grid (the heads, head
    dim, batch, seed and device); the rest are each cell's own (its mask, length, direction, dtype)."""
    return settled({name: config[name] for name in names() if name in config})


# Flags that take a value of their own kind: the direction one of DIRECTIONS, mask_params JSON.
_FLAG_OPTIONS = {"direction": {"choices": DIRECTIONS}, "mask_params": {"type": json.loads}}


def add_flags(parser) -> None:
    """A command-line flag per field (``--heads-q``), with the field's default; ``--mask`` and
    ``--seqlen`` have none (the caller asks for them, or for every setting as JSON)."""
    for f in dataclasses.fields(ProblemSpec):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        options = {"type": int if f.type in ("int", "int | None") else str, "help": f.metadata["help"],
                   "default": None if default is dataclasses.MISSING else default, **_FLAG_OPTIONS.get(f.name, {})}
        parser.add_argument("--" + f.name.replace("_", "-"), **options)
