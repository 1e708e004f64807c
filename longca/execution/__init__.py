"""Running cells: one measurement each, whatever goes wrong, turned into one result row.

Four rooms, each a job, lowest first; a room imports only its own and the rooms before it here, and
those only at module level, through their modules' public names (``tests/test_layout.py`` checks it):

* ``cache``: cache keys and what they find (``parts``: a kernel cell's parts and their keys;
  ``fingerprint``: the code part of a key; ``store``: each measured part by its key; ``kept_rows``:
  rows kept outside what Snakemake deletes; ``atomic``);
* ``measure``: what a measurement is (a kernel cell's gate, timing and memory parts; a CP cell on
  every rank; the environment a row records; ``longca check``);
* ``processes``: where a cell runs on this machine (``runner``: a forked child; ``worker``; the
  resident measuring process per GPU, ``resident``, the resident CP group's ranks, ``cp_resident``,
  and their ``wire`` protocol; ``isolate``: crashes and hangs as rows; ``gpu_slots``; ``progress``:
  the run's progress line);
* ``cluster``: runs across GPUs and nodes (``placement``: a local run or a SLURM job; ``slurm_jobs``:
  each job's size; ``cp_launch`` and ``cp_group``: CP cells on torchrun).

Builds on ``longca.attention``, ``longca.kernels`` and ``longca.cp``; the results side builds on it.
"""
