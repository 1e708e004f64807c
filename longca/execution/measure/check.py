"""``longca check``: the correctness gate for every available kernel × mask, as a table.

The same gate every cell runs before it is timed (``longca.execution.measure.gate.correctness_gate``): output, and
for backward dq/dk/dv, against the float64 reference, with the tolerances written next to it.
Meant as the first thing to run on a new machine or after changing an adapter.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Iterable

import torch

from ... import kernels
from ...attention import masks
from ...attention.problem import Problem, parse_dtype
from ...kernels.base import Unsupported
from .cell import is_oom
from .gate import correctness_gate

# Parameters that make each pattern non-trivial at the check's small lengths (defaults such as a
# 1024-token window would cover the whole sequence and hide the mask).
CHECK_PARAMS: dict[str, dict] = {
    "sliding_window": {"window": 48},
    "sliding_window_causal": {"window": 48},
    "global_sliding_window": {"window": 32, "global_tokens": 16},
    "varlen_block_causal": {"block": 32},
    "block_sparse": {"block": 64, "density": 0.3},
    "block_sparse_heads": {"block": 32, "kept": 0.3},
    "variable_block_sparse_heads": {"block": 64, "unit": 16, "kept": 0.3},
}
_SHORT_DOCS = {"edges": [16, 64, 200], "weights": [1.0, 1.0]}


def check_masks() -> list[str]:
    return list(masks.PATTERNS) + [masks.BLOCK_SPARSE, *masks.HEAD_PATTERNS]


def _params(pattern: str, heads_q: int, heads_kv: int) -> dict:
    params = dict(CHECK_PARAMS.get(pattern, {}))
    if pattern in masks.HEAD_PATTERNS:  # a pattern per KV head: the problem's heads
        params.update(heads=heads_kv, group=heads_q // heads_kv)
    if pattern in masks.DOCUMENT_PATTERNS and not pattern.endswith("_long"):
        params["histogram"] = _SHORT_DOCS  # several documents at a few hundred tokens
    return params


@dataclasses.dataclass
class CheckResult:
    kernel: str
    mask: str
    direction: str
    status: str      # ok, wrong, unsupported, oom, error
    detail: str


def check(kernel_names: Iterable[str], mask_names: Iterable[str], directions: Iterable[str], *,
          device: str, dtype: str, seqlen: int, heads_q: int, heads_kv: int, head_dim: int,
          seed: int = 0) -> list[CheckResult]:
    results = []
    for name in kernel_names:
        kernel = kernels.get(name)
        for mask in mask_names:
            for direction in directions:
                try:
                    problem = Problem(mask, seqlen, 1, heads_q, heads_kv, head_dim, parse_dtype(dtype),
                                      torch.device(device), direction, seed, _params(mask, heads_q, heads_kv))
                    reason = masks.kernel_takes(kernel, problem.mask) or kernel.supports(problem)
                    if reason:
                        results.append(CheckResult(name, mask, direction, "unsupported", reason))
                        continue
                    ok, _, _, detail = correctness_gate(kernel, problem)
                    results.append(CheckResult(name, mask, direction, "ok" if ok else "wrong", detail))
                except Unsupported as exc:  # refused by the library in prepare, as run_cell reports it
                    results.append(CheckResult(name, mask, direction, "unsupported", str(exc)))
                except Exception as exc:  # noqa: BLE001 — reported in the table
                    status = "oom" if is_oom(exc) else "error"
                    results.append(CheckResult(name, mask, direction, status,
                                               traceback.format_exception_only(type(exc), exc)[-1].strip()))
    return results


def format_table(results: list[CheckResult]) -> str:
    lines = [f"{'kernel':16s} {'mask':24s} {'dir':4s} {'status':12s} detail"]
    for r in results:
        lines.append(f"{r.kernel:16s} {r.mask:24s} {r.direction:4s} {r.status:12s} {r.detail}")
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    lines.append("summary: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return "\n".join(lines)
