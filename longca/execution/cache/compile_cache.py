"""Compiled kernels kept with the run: the compilers' on-disk caches under ``results/compile_cache/``.

FlexAttention (Inductor), the Triton kernels and the CuTe DSL compile each new shape on its first
call in a process, and keep what they compiled on disk where their environment variable says
(by default ``/tmp`` or ``~/.triton``: node-local, anonymous, gone with a fresh box).  The workflow
points them into the run directory instead, so that a compilation is paid once per run, not once
per measuring process: a SLURM cell (a child process of its own on whichever node) or a measuring
process started after a crash or idle exit finds the kernel compiled and loads it.  A cache hit
loads the kernel the compilation wrote, so what is measured does not change; each compiler keys
its entries on its own version and the source it compiled.  Deleting ``results/`` starts from
nothing, compilations included.  A variable already set by the caller is kept
(``lab/longca_lab/bench_pipeline.py`` gives each side caches of its own).

Free of heavy imports: the Snakefile uses it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import MutableMapping

from ... import run_dir

# Each compiler's cache variable, and its folder under the run's compile cache.
FOLDERS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton", "CUTE_DSL_CACHE_DIR": "cute"}
DEFAULT = Path(run_dir.COMPILE_CACHE)


def environment(root: str | os.PathLike) -> dict[str, str]:
    """The variables that point every compiler's cache under ``root`` (absolute)."""
    root = Path(root).resolve()
    return {name: str(root / folder) for name, folder in FOLDERS.items()}


def point_at(root: str | os.PathLike, environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set each cache variable ``environ`` leaves unset (or empty) to its folder under ``root``;
    return the variables as they now are."""
    for name, path in environment(root).items():
        if not environ.get(name):
            environ[name] = path
    return {name: environ[name] for name in FOLDERS}
