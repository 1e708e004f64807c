"""CP launch environments (config ``cp_env``): named sets of environment variables every rank of a
CP cell starts with.  Torch-free: config validates the name, the launcher sets the variables, the
ranks record what they saw.

Compute/communication overlap depends on variables read when CUDA creates its context or NCCL its
communicators (``CUDA_DEVICE_MAX_CONNECTIONS``, ``NCCL_*``, ``TORCH_NCCL_*``), so they cannot be set
by the measuring code: they go into the environment of the ``torchrun`` that starts the ranks (and
of a resident group, which serves only cells of its own preset).  The presets are data
(``longca/cp_envs.yaml``).  A cell's settings name a preset other than ``default`` (``cp_env``), so
such a cell has another cache key, while a default cell's settings, and so its key, are what they
were before presets existed.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, Mapping

PRESETS_PATH = Path(__file__).resolve().parent / "cp_envs.yaml"  # package data (pyproject.toml)
DEFAULT = "default"
KEY = "cp_env"  # the config key, the settings key and the row's column


@functools.cache
def presets() -> dict[str, dict[str, str]]:
    """Every preset by name: the variables it sets (strings, as an environment holds them)."""
    import yaml

    data = yaml.safe_load(PRESETS_PATH.read_text())
    return {name: {str(k): str(v) for k, v in (variables or {}).items()} for name, variables in data.items()}


def problem(name: Any) -> str | None:
    """Why ``name`` is no preset (None when it is one)."""
    if name in presets():
        return None
    return f"unknown CP launch environment {name!r}; known: {', '.join(presets())}"


def variables(name: str) -> dict[str, str]:
    """The variables preset ``name`` sets (ValueError naming the presets for an unknown name)."""
    why = problem(name)
    if why:
        raise ValueError(why)
    return dict(presets()[name])


def watched() -> tuple[str, ...]:
    """Every variable a preset sets: what a row records the ranks saw, whichever preset it ran (a
    default row then says whether the shell had set any of them)."""
    return tuple(sorted({v for variables_ in presets().values() for v in variables_}))


def of(settings: Mapping[str, Any]) -> str:
    """The preset a cell's settings name."""
    return settings.get(KEY, DEFAULT)


# The settings key holding the variables a preset sets: with them in the cell's key, editing a
# preset in cp_envs.yaml measures its cells again.
SET_KEY = "cp_env_set"


def settings_entry(name: str) -> dict[str, Any]:
    """What a preset adds to a cell's settings (its cache key): its name and the variables it sets;
    nothing for ``default``, so a default cell's key is what it was before presets existed."""
    return {} if name == DEFAULT else {KEY: name, SET_KEY: variables(name)}


def split(settings: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """``(the settings without the preset, the preset)``: the preset is the launch's, not the
    measurement's (``CPSpec`` has no field for it, so its code, and every default cell's key, stay)."""
    rest = dict(settings)
    rest.pop(SET_KEY, None)
    return rest, rest.pop(KEY, DEFAULT)


def environ(name: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with preset ``name``'s variables set."""
    return {**(os.environ if base is None else base), **variables(name)}


def seen(env: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The watched variables as this process sees them (None: unset)."""
    env = os.environ if env is None else env
    return {name: env.get(name) for name in watched()}


def record(row: dict, name: str, per_rank: list[dict[str, str | None]]) -> dict:
    """Put into ``row`` the preset (``cp_env``) and what the ranks saw (``cp_env_vars``, JSON: rank
    0's, the others' being the same).  A rank that lacks a variable the preset sets, or ranks that
    disagree, make the row an ``error``: its numbers were not measured under the preset."""
    row[KEY] = name
    row["cp_env_vars"] = json.dumps(per_rank[0], sort_keys=True) if per_rank else None
    wanted = presets().get(name, {})
    for rank, env in enumerate(per_rank):
        wrong = {k: env.get(k) for k, v in wanted.items() if env.get(k) != v}
        if wrong or env != per_rank[0]:
            saw = wrong or {k: v for k, v in env.items() if v != per_rank[0].get(k)}
            why = (f"CP launch environment {name!r}: rank {rank} saw "
                   + ", ".join(f"{k}={v}" for k, v in sorted(saw.items()))
                   + (f" (the preset sets {', '.join(f'{k}={wanted[k]}' for k in sorted(wrong))})" if wrong
                      else " (rank 0 saw otherwise)"))
            if row.get("status") == "ok" or not row.get("reason"):
                row["status"], row["reason"] = "error", why
            else:
                row["reason"] = f"{row['reason']}; {why}"
            break
    return row
