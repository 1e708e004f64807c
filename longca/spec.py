"""A cell's problem as settings, declared once and free of torch: ``ProblemSpec``.

Config resolves to these fields, a kernel cell's and a CP cell's specs extend them
(``longca.execution.measure.cell.CellSpec``, ``cp_cell.CPSpec``), the parts' cache keys take them
(``longca.execution.cache.parts.PROBLEM_SETTINGS``), ``longca run-cell`` has a flag for each and
the Parquet tables a column for each (``longca.problem_settings`` derives those; the table's
columns are held to these by ``tests/test_spec.py``).  This module is in every part's cache key
(its code is the problem's), so what only uses the fields lives in ``longca.problem_settings``.  ``longca.attention.problem.Problem`` is the problem built from
them: masks and tensors, which need torch; ``Problem.from_spec`` builds it (this module imports none
of it).  Beside ``longca.timing_spec``
(how a cell is timed), which is declared the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

DIRECTIONS = ("fwd", "bwd")


@dataclass(frozen=True, kw_only=True)
class ProblemSpec:
    """A problem as settings (names and numbers, as config, cells and cache keys hold them).

    The part every kind of cell shares: a kernel cell's spec and a CP cell's spec extend it, so a
    new problem field is added here once.  ``pattern`` names the builder in ``masks.PATTERNS`` when
    ``mask`` is a config name of a parametrised variant (default: ``mask`` itself)."""

    mask: str = field(metadata={"help": "the mask: a pattern (`longca masks` lists them) or a config variant's name"})
    seqlen: int = field(metadata={"help": "sequence length (tokens)"})
    direction: str = field(default="fwd", metadata={"help": "forward, or backward (timed alone, after an untimed forward)"})
    dtype: str = field(default="float32", metadata={"help": "torch dtype of q, k and v (float32, bfloat16, float16)"})
    batch: int = field(default=1, metadata={"help": "sequences per call"})
    heads_q: int = field(default=8, metadata={"help": "query heads"})
    heads_kv: int = field(default=8, metadata={"help": "key/value heads (GQA when fewer than query heads)"})
    head_dim: int = field(default=64, metadata={"help": "head dimension"})
    # Set only where it differs from head_dim (DeepSeek-V3's MLA: q/k 192, v 128).  Unset (None) or
    # equal, it is left out of a cell's settings and cache keys (``problem_settings.settled``), so
    # every cell of one head dim keeps the key it had before this field existed.
    head_dim_v: int | None = field(default=None, metadata={
        "help": "head dimension of v and the output, when it differs from head_dim (default: head_dim)"})
    mask_params: dict[str, Any] = field(default_factory=dict, metadata={"help": "JSON object of mask parameters"})
    seed: int = field(default=0, metadata={"help": "seed of the inputs and of masks that draw (documents, blocks)"})
    device: str = field(default="cpu", metadata={"help": "cpu or cuda"})
    pattern: str | None = field(default=None, metadata={
        "help": "the pattern a config variant's name resolves to (default: the mask itself)"})

    # What the settings are called in an error about unknown keys.
    SETTINGS_NAME = "problem"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown {cls.SETTINGS_NAME} setting(s): {', '.join(unknown)}")
        return cls(**data)

