"""Running cells: one measurement each, whatever goes wrong, turned into one result row.

``cell`` (gate, timing, row) and ``cp_cell`` / ``cp_launch`` (a CP cell on a torchrun process
group) are what a measurement is; ``timing`` how long; ``runner``, ``isolate``, ``worker``,
``resident`` and ``gpu_slots`` where it runs (a forked child, a warm worker, a long-lived measuring
process per GPU); ``fingerprint`` the code part of a cell's cache key; ``progress`` the run's
progress line; ``check`` the correctness gate as a table; ``ceilings`` the machine's measured matmul
rate.  Builds on ``longca.attention``, ``longca.kernels`` and ``longca.cp``; the results side builds
on it.
"""
