"""A cell's identity, spelled once: its name, the file its row goes to and its log.

Kernel cells are ``kernel/mask/dtype_direction_seqlen``, where a cell of a shape other than the
grid's own (config ``head_dims``, ``gqa_ratios``, ``batches``, ``models``) has the shape's mark after its
mask (``causal@h64k8d256b2``: 64 query heads, 8 KV heads, head dim 256, batch 2;
``causal@h128k128d192v128b1``: q/k head dim 192, v 128), CP cells
``strategy/mask/dtype_direction_<tokens per rank>x<cp_size>``.  The Snakemake rules take their
output patterns from here, ``longca.config`` the grid's cells, the ``run-cell`` and ``cp-cell``
commands a row's default ``cell_id``, and the tables and benchmarks a cell's name from its file.
Torch-free and import-light: the thin ``run-cell`` client imports it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from . import run_dir

KERNEL_NAME = "{kernel}/{mask}/{dtype}_{direction}_{seqlen}"
KERNEL_FILE = f"{run_dir.KERNEL_CELLS}/{KERNEL_NAME}.json"
KERNEL_LOG = f"{run_dir.KERNEL_LOGS}/{KERNEL_NAME}.log"

CP_NAME = "{strategy}/{mask}/{dtype}_{direction}_{tokens}x{cp_size}"
CP_FILE = f"{run_dir.CP_CELLS}/{CP_NAME}.json"
CP_LOG = f"{run_dir.CP_LOGS}/{CP_NAME}.log"
CP_UNPLACED_FILE = f"{run_dir.CP_UNPLACED_CELLS}/{CP_NAME}.json"  # a cell this run cannot place

# A CP cell of a document mask measured on another document layout (config `cp_layouts`): its mask
# is spelled ``<mask>~layout<i>``.  Layout 0 is the mask's own name, so a cell keeps its name (and
# its row) whether or not more layouts are asked for.
LAYOUT_MARK = "~layout"


def tokens_per_rank(seqlen, cp_size):
    """The tokens each of ``cp_size`` ranks holds of a ``seqlen``-token sequence (``cp_seqlen``'s
    inverse; element-wise on Series)."""
    return seqlen // cp_size


def cp_seqlen(tokens_per_rank, cp_size):
    """The whole sequence of a CP cell: ``tokens_per_rank`` on each of ``cp_size`` ranks."""
    return tokens_per_rank * cp_size


def layout_mask(mask: str, layout: int) -> str:
    """The mask a CP cell of layout ``layout`` names (``mask`` itself for layout 0)."""
    return mask if layout == 0 else f"{mask}{LAYOUT_MARK}{layout}"


def split_layout(mask: str) -> tuple[str, int]:
    """``(the config's mask name, layout)`` of a CP cell's mask (``layout_mask``'s inverse)."""
    base, mark, layout = mask.rpartition(LAYOUT_MARK)
    return (base, int(layout)) if mark and layout.isdigit() else (mask, 0)


# A kernel cell of another shape than the grid's own names its mask ``<mask>@h<heads_q>k<heads_kv>d<head_dim>b<batch>``
# (the mark is in the cell's settings, its row's ``mask`` and its path, so tables and figures keep
# each shape apart as they keep masks apart).  The grid's own shape keeps the mask's name, so a grid
# of one shape keeps its cells' names, files and cache keys.  A value head dim other than the
# query/key one (``head_dim_v``: DeepSeek-V3's MLA) follows the head dim, ``d192v128``; a shape of
# one head dim has the mark it always had.
SHAPE_MARK = "@"
_SHAPE_RE = re.compile(r"@h(?P<heads_q>\d+)k(?P<heads_kv>\d+)d(?P<head_dim>\d+)(?:v(?P<head_dim_v>\d+))?"
                       r"b(?P<batch>\d+)$")


@dataclass(frozen=True)
class Shape:
    """The problem shape a cell runs: heads, head dim (and v's where it differs) and sequences per
    call.  ``head_dim_v`` equal to ``head_dim`` is kept as None: a shape has one spelling."""
    heads_q: int
    heads_kv: int
    head_dim: int
    batch: int = 1
    head_dim_v: int | None = None

    def __post_init__(self) -> None:
        if self.head_dim_v == self.head_dim:
            object.__setattr__(self, "head_dim_v", None)

    @property
    def mark(self) -> str:
        v = "" if self.head_dim_v is None else f"v{self.head_dim_v}"
        return f"{SHAPE_MARK}h{self.heads_q}k{self.heads_kv}d{self.head_dim}{v}b{self.batch}"

    def settings(self) -> dict[str, int]:
        """The shape as a cell's settings hold it: ``head_dim_v`` only where it is set."""
        out = {"heads_q": self.heads_q, "heads_kv": self.heads_kv, "head_dim": self.head_dim, "batch": self.batch}
        if self.head_dim_v is not None:
            out["head_dim_v"] = self.head_dim_v
        return out

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> "Shape":
        """The shape a config or a cell's settings hold (its ``heads_q`` … ``batch`` keys and
        ``head_dim_v`` where present)."""
        v = settings.get("head_dim_v")
        return cls(*(int(settings[k]) for k in ("heads_q", "heads_kv", "head_dim", "batch")),
                   head_dim_v=None if _unset(v) else int(v))


def _unset(value: Any) -> bool:
    """None, or a table's missing value (NaN, pandas' NA): a row of one head dim."""
    try:
        return value is None or bool(value != value)
    except TypeError:  # pandas' NA compares to NA
        return True


def shaped_mask(mask: str, shape: Shape, grid_shape: Shape) -> str:
    """The mask a cell of ``shape`` names: ``mask`` itself at the grid's own shape."""
    return mask if shape == grid_shape else f"{mask}{shape.mark}"


def split_shape(mask: str) -> tuple[str, Shape | None]:
    """``(the config's mask name, the shape its mark names or None)`` (``shaped_mask``'s inverse)."""
    match = _SHAPE_RE.search(mask)
    if match is None:
        return mask, None
    return mask[:match.start()], Shape(**{k: int(v) for k, v in match.groupdict().items() if v is not None})


@dataclass(frozen=True)
class KernelCell:
    kernel: str
    mask: str
    seqlen: int
    direction: str
    dtype: str

    @property
    def name(self) -> str:
        """How tables, logs and the benchmarks' options name the cell."""
        return KERNEL_NAME.format(**asdict(self))

    @property
    def path(self) -> str:
        return KERNEL_FILE.format(**asdict(self))


@dataclass(frozen=True)
class CPCell:
    strategy: str
    mask: str
    tokens_per_rank: int
    cp_size: int
    direction: str
    dtype: str

    def _fields(self) -> dict[str, Any]:
        return {**asdict(self), "tokens": self.tokens_per_rank}

    @property
    def name(self) -> str:
        return CP_NAME.format(**self._fields())

    @property
    def path(self) -> str:
        return CP_FILE.format(**self._fields())

    @property
    def unplaced_path(self) -> str:
        """Where the row of a cell this run cannot place goes (rule cp_cell_unplaced)."""
        return CP_UNPLACED_FILE.format(**self._fields())


def kernel_cell_id(settings: Mapping[str, Any]) -> str:
    """A kernel cell's name from its settings (a row's ``cell_id``)."""
    return KERNEL_NAME.format(**settings)


def cp_cell_id(settings: Mapping[str, Any]) -> str:
    """A CP cell's name from its settings (``seqlen`` is the whole sequence over ``cp_size`` ranks)."""
    return CP_NAME.format(**settings, tokens=tokens_per_rank(int(settings["seqlen"]), int(settings["cp_size"])))


def cell_name(path: str) -> str:
    """A kernel cell's name from its file's path (``KernelCell.name``)."""
    return path.removeprefix(KERNEL_FILE.split("{")[0]).removesuffix(".json")


# The name's last three path components (a row file's folders come before them).
_NAME_RE = re.compile(r"(?:^|/)(?P<first>[^/]+)/(?P<mask>[^/]+)/(?P<dtype>[^_/]+)_(?P<direction>fwd|bwd)_"
                      r"(?:(?P<tokens>\d+)x(?P<cp_size>\d+)|(?P<seqlen>\d+))$")


def from_name(name: str) -> KernelCell | CPCell | None:
    """The cell a name (or a row file's path) spells, or None: what a row that cannot be read still
    says about its cell."""
    match = _NAME_RE.search(name.removesuffix(".json"))
    if match is None:
        return None
    g = match.groupdict()
    if g["tokens"] is not None:
        return CPCell(g["first"], g["mask"], int(g["tokens"]), int(g["cp_size"]), g["direction"], g["dtype"])
    return KernelCell(g["first"], g["mask"], int(g["seqlen"]), g["direction"], g["dtype"])
