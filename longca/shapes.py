"""The shapes a grid measures: its shape axes (config ``head_dims``, ``gqa_ratios``, ``batches``) and
its model presets (``models``: a named shape and the masks that model trains with).  A ``head_dims``
entry ``"192/128"`` (or a preset's ``head_dim_v``) is a value head dim other than the query/key one
(DeepSeek-V3's MLA), marked ``d192v128`` in its cells' names.

Pure data over the resolved config, torch-free; ``longca.config`` pairs each shape with its masks
(``config.grid_masks``).  A cell's shape is ``longca.cells.Shape``, named in its mask by its mark.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .cells import Shape

PRESETS_PATH = Path(__file__).resolve().parent / "models.yaml"  # package data (pyproject.toml)
MQA = "mqa"  # a gqa_ratios entry: one KV head, whatever heads_q is


@functools.lru_cache(maxsize=1)
def presets() -> dict[str, dict[str, Any]]:
    """The shipped presets by name (``longca/models.yaml``)."""
    return yaml.safe_load(PRESETS_PATH.read_text())


@dataclass(frozen=True)
class Model:
    name: str
    title: str
    heads_q: int
    heads_kv: int
    head_dim: int
    masks: tuple  # mask items, as config's `masks` takes them
    head_dim_v: int | None = None  # v's head dim where it differs (DeepSeek-V3's MLA: 192/128)


def models(config: dict) -> list[Model]:
    """The config's presets, resolved (a name to the shipped preset; an object is its own).  An
    unknown name is left to ``problems`` to name; here it is skipped."""
    out = []
    for item in config.get("models") or []:
        data = presets().get(item) if isinstance(item, str) else item
        if data is not None:
            name = item if isinstance(item, str) else item["name"]
            out.append(Model(name, data.get("title", name), data["heads_q"], data["heads_kv"], data["head_dim"],
                             tuple(data["masks"]), data.get("head_dim_v")))
    return out


def grid_shape(config: dict) -> Shape:
    """The grid's own shape: its single-value keys.  Its cells keep their masks' plain names."""
    return Shape.of(config)


def head_dim_pair(entry) -> tuple[int, int | None]:
    """A ``head_dims`` entry as (q/k head dim, v head dim or None): ``128`` or ``"192/128"``."""
    if isinstance(entry, str) and "/" in entry:
        qk, v = entry.split("/", 1)
        return int(qk), (None if int(v) == int(qk) else int(v))
    return int(entry), None


def _kv_heads(heads_q: int, ratio) -> int:
    return 1 if ratio == MQA else heads_q // int(ratio)


def batch_seqlen(config: dict, seqlen: int, batch: int) -> int:
    """The length of each of ``batch`` sequences at the fixed total ``batch`` × ``seqlen`` of the
    grid's own batch (``batches``: batch b at seqlen / b)."""
    return seqlen * int(config["batch"]) // batch


def batches(config: dict) -> list[int]:
    return list(config.get("batches") or [config["batch"]])


def axis_shapes(config: dict) -> list[Shape]:
    """The shapes the grid's ``masks`` run at: head dims × query:KV ratios × batches, the grid's own
    first (its cells keep their names whatever the axes add)."""
    own = grid_shape(config)
    dims = [head_dim_pair(d) for d in config.get("head_dims") or [own.head_dim]]
    kv = ([_kv_heads(own.heads_q, r) for r in config["gqa_ratios"]] if config.get("gqa_ratios")
          else [own.heads_kv])
    shapes = [Shape(own.heads_q, h, d, b, dv) for (d, dv), h, b in itertools.product(dims, kv, batches(config))]
    return sorted(dict.fromkeys(shapes), key=lambda s: s != own)


def model_shapes(config: dict, model: Model) -> list[Shape]:
    """A preset's shape at each of the grid's batches."""
    return [Shape(model.heads_q, model.heads_kv, model.head_dim, b, model.head_dim_v) for b in batches(config)]


def problems(config: dict) -> list[str]:
    """What the schema cannot say of the shape keys, each naming its key: an unknown preset, a ratio
    that does not divide ``heads_q``, a preset whose query heads are no multiple of its KV heads, a
    batch that does not divide a length."""
    out = []
    for i, item in enumerate(config.get("models") or []):
        if isinstance(item, str) and item not in presets():
            out.append(f"config.models[{i}]: unknown model preset {item!r}; known: {', '.join(presets())}")
    for i, model in enumerate(models(config)):
        if model.heads_q % model.heads_kv:
            out.append(f"config.models[{i}] ({model.name}): heads_q {model.heads_q} is not a multiple of "
                       f"heads_kv {model.heads_kv}")
    for i, ratio in enumerate(config.get("gqa_ratios") or []):
        if ratio != MQA and config["heads_q"] % int(ratio):
            out.append(f"config.gqa_ratios[{i}]: {ratio} does not divide config.heads_q = {config['heads_q']}")
    for i, batch in enumerate(config.get("batches") or []):
        tokens = [n * config["batch"] for n in config["seqlens"]]
        bad = [n for n, t in zip(config["seqlens"], tokens) if t % batch]
        if bad:
            out.append(f"config.batches[{i}]: {batch} does not divide the tokens of seqlen {bad[0]} "
                       f"(batch {config['batch']} × {bad[0]}): each of its sequences would be a fraction long")
    return out
