"""Code fingerprints: part of every cell's cache key.

A kernel cell's number is determined by its resolved settings and by the code that computes it:
its kernel adapter's module plus the shared measurement code.  Hashing exactly those files means
changing one adapter reruns that adapter's cells only, while a change to the timing or the gate
reruns every cell.  Report-side code (results, plots, report) is deliberately not included.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # longca/: fingerprints name files relative to it

# Shared measurement code, relative to the package.
MEASUREMENT_CODE = ("attention/errors.py", "attention/masks/__init__.py", "attention/masks/slices.py",
                    "attention/masks/_checks.py", "attention/masks/_shapes.py", "attention/masks/patterns.py",
                    "attention/masks/custom.py", "attention/masks/block_sparse.py",
                    "attention/varlen.py", "attention/mask_convert.py", "attention/problem.py",
                    "attention/reference.py", "attention/flops.py",
                    "attention/data/doclen_default.json", "execution/timing.py", "execution/graphed.py",
                    "execution/cell.py", "execution/env.py", "kernels/__init__.py", "kernels/base.py")


@functools.lru_cache(maxsize=None)
def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_fingerprint(paths) -> str:
    h = hashlib.sha256()
    for path in sorted({Path(p).resolve() for p in paths}):
        if path.exists():  # an optional module not written yet hashes as absent
            h.update(str(path.relative_to(PACKAGE)).encode())
            h.update(_file_digest(path).encode())
    return h.hexdigest()[:16]


def kernel_files(kernel: str) -> list[Path]:
    """The files a kernel cell's number depends on: the shared measurement code and its adapter."""
    from .. import kernels

    return [PACKAGE / p for p in MEASUREMENT_CODE] + [kernels.source_file(kernel)]


def kernel_fingerprint(kernel: str) -> str:
    return files_fingerprint(kernel_files(kernel))


def cp_fingerprint(strategy: str, local_kernel: str | None = None) -> str:
    """A CP cell's code: the shared measurement code, the strategy's module and the CP machinery,
    and the local kernel's adapter with its attention-with-LSE ops."""
    from .. import cp, kernels

    files = ([PACKAGE / p for p in MEASUREMENT_CODE] + cp.source_files(strategy)
             + [PACKAGE / "execution" / "cp_cell.py", PACKAGE / "kernels" / "_lse_ops.py"])
    if local_kernel:
        files.append(kernels.source_file(local_kernel))
    return files_fingerprint(files)
