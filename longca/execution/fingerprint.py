"""Code fingerprints: part of every cell's cache key.

A kernel cell's number is determined by its resolved settings and by the code that computes it:
its kernel adapter's module plus the shared measurement code.  Hashing exactly those files means
changing one adapter reruns that adapter's cells only, while a change to the timing or the gate
reruns every cell.  Report-side code (results, plots, report) is deliberately not included.

The key follows what the code does, not where it is or how it reads: a Python file counts by its
code lines (``code_lines``: without docstrings, comments, blank lines and import statements; an
import computes nothing, and the files it brings in are hashed themselves), and the fingerprint is
over the files' digests, not their names.  So moving, renaming, commenting, documenting or
re-importing code re-times nothing, while a changed statement reruns the cells it computes.  Data
files count byte for byte.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # longca/: the files below are named relative to it

# Shared measurement code, relative to the package.
MEASUREMENT_CODE = ("attention/errors.py", "attention/masks/__init__.py", "attention/masks/slices.py",
                    "attention/masks/_checks.py", "attention/masks/_shapes.py", "attention/masks/patterns.py",
                    "attention/masks/custom.py", "attention/masks/block_sparse.py",
                    "attention/varlen.py", "attention/mask_convert.py", "attention/problem.py",
                    "attention/reference.py", "attention/flops.py",
                    "attention/data/doclen_default.json", "execution/measure/timing.py", "execution/measure/graphed.py",
                    "execution/measure/cell.py", "execution/measure/env.py", "kernels/__init__.py", "kernels/base.py")


def code_lines(source: str) -> list[str]:
    """The lines of a Python module that compute something: without docstrings, import statements,
    comments (whole lines and the end of a line) and blank lines.  A docstring or an import that
    shares a line with other code stays."""
    tree = ast.parse(source)
    drop: set[int] = set()
    # Lines where a simple statement other than an import starts: an import sharing one stays.
    busy = {n.lineno for n in ast.walk(tree) if isinstance(n, ast.stmt) and not hasattr(n, "body")
            and not isinstance(n, (ast.Import, ast.ImportFrom))}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            drop.update(set(range(node.lineno, node.end_lineno + 1)) - busy)
        body = getattr(node, "body", None)
        if not isinstance(body, list) or not body or not isinstance(body[0], ast.Expr):
            continue
        doc = body[0].value
        if not (isinstance(doc, ast.Constant) and isinstance(doc.value, str)):
            continue
        first, last = doc.lineno, doc.end_lineno
        alone = (not hasattr(node, "lineno") or node.lineno < first) and (len(body) < 2 or body[1].lineno > last)
        if alone:
            drop.update(range(first, last + 1))
    comment_at = {tok.start[0]: tok.start[1] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                  if tok.type == tokenize.COMMENT}
    kept = []
    for number, line in enumerate(source.splitlines(), 1):
        if number in drop:
            continue
        line = line[:comment_at[number]] if number in comment_at else line
        if line.strip():
            kept.append(line.rstrip())
    return kept


@functools.lru_cache(maxsize=None)
def file_digest(path: Path) -> str:
    """What a file contributes to a fingerprint: its code lines (Python) or its bytes (data)."""
    if path.suffix == ".py":
        return hashlib.sha256("\n".join(code_lines(path.read_text())).encode()).hexdigest()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_fingerprint(paths) -> str:
    """The fingerprint of the code in ``paths``: their digests, sorted, so not their names or order."""
    h = hashlib.sha256()
    for digest in sorted(file_digest(path) for path in {Path(p).resolve() for p in paths} if path.exists()):
        h.update(digest.encode())  # a module not written yet (an optional one) counts as absent
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
             + [PACKAGE / "execution" / "measure" / "cp_cell.py", PACKAGE / "kernels" / "_lse_ops.py"])
    if local_kernel:
        files.append(kernels.source_file(local_kernel))
    return files_fingerprint(files)
