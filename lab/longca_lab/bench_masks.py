"""Time to build each mask pattern (and compute its exact area) at long lengths.

Building a mask must never be what a benchmark cell waits on: patterns are slice lists whose
size grows with the number of documents/blocks, not with seqlen².  Prints a markdown table:
median and [min, max] over ``--repeats`` runs, in milliseconds.

    PYTHONPATH=. python lab/longca_lab/bench_masks.py [--seqlens 131072 1048576] [--repeats 7]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from typing import Callable

from longca.api import block_sparsity
from longca.api import PATTERNS, build


def _times_ms(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # warm-up: first-call imports and histogram loading are not the steady state
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def _cell(ts: list[float]) -> str:
    return f"{statistics.median(ts):.2f} [{min(ts):.2f}, {max(ts):.2f}]"


def _label(n: int) -> str:
    return f"{n // (1 << 20)}M" if n % (1 << 20) == 0 else f"{n // 1024}K"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[128 * 1024, 1024 * 1024])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--sparsity-seqlen", type=int, default=128 * 1024)
    ap.add_argument("--block", type=int, default=128)
    args = ap.parse_args()

    print(f"machine: {platform.machine()} {platform.system()}, python {platform.python_version()}")
    print(f"median [min, max] of {args.repeats} runs, ms; build + area(); "
          f"block_sparsity({args.block}×{args.block}) at {_label(args.sparsity_seqlen)}\n")
    head = ["pattern", *(f"build {_label(n)} (ms)" for n in args.seqlens), "slices @max",
            f"block_sparsity {_label(args.sparsity_seqlen)} (ms)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for name in PATTERNS:
        cells = [f"`{name}`"]
        for n in args.seqlens:
            cells.append(_cell(_times_ms(lambda: build(name, n, seed=0).area(), args.repeats)))
        cells.append(str(len(build(name, args.seqlens[-1], seed=0).slices)))
        m = build(name, args.sparsity_seqlen, seed=0)
        cells.append(_cell(_times_ms(lambda: block_sparsity(m, args.block, args.block),
                                     args.repeats)))
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
