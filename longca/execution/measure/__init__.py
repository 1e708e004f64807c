"""What a cell measures and how: the correctness gate and timing of a kernel cell (``cell``,
``timing``, ``graphed``), a CP cell on every rank (``cp_cell``, ``cp_rank``: what torchrun starts),
the environment a row records (``env``), the machine's matmul ceiling (``ceilings``) and ``longca
check`` (``check``).  Where and how a cell runs (a forked child, the warm worker, the resident GPU
process, torchrun, SLURM) is the rest of ``longca.execution``."""
