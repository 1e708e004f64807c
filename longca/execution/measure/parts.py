"""Where the part table was: it is ``longca.execution.cache.parts`` now (the cache room, under what is
measured).  Kept for scripts that import it from here (``benchmarks/restore_cells.py``)."""

from ..cache.parts import PARTS, PROBLEM_CODE, PROBLEM_SETTINGS, REGISTRIES, Part, part_key, part_settings

__all__ = ["PARTS", "PROBLEM_CODE", "PROBLEM_SETTINGS", "REGISTRIES", "Part", "part_key", "part_settings"]
