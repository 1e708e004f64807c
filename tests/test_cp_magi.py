"""The parts of the ``magi`` strategy that run without a GPU: the per-rank area it reports and the
byte count of MagiAttention's own collectives (on a real 2-rank gloo group under torchrun).  The
strategy itself is checked against the reference by every CP cell's gate on a GPU; on the CPU it
must be ``unsupported`` with a reason (tests/test_cp_distributed.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from longca.attention import masks
from longca.cp.magi import rows_area

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("name", ["causal", "varlen_causal", "sliding_window_causal", "shared_question"])
def test_rows_area_counts_the_dense_rows(name):
    mask = masks.build(name, 512, seed=3)
    dense = mask.to_dense().sum(1).numpy()
    rows = np.random.default_rng(0).choice(512, size=200, replace=False)
    assert rows_area(mask, rows) == int(dense[rows].sum())
    assert rows_area(mask, np.arange(512)) == mask.area()


COUNT_SCRIPT = r'''
import json, sys
import torch, torch.distributed as dist
from longca.cp.magi import _CountedCollectives

class Owner:
    comm_bytes = 0

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
owner = Owner()
original = dist.all_to_all_single
counter = _CountedCollectives(owner)
# Uneven all-to-all-v: rank r sends r+1 rows of 4 float32 to itself and 3 rows to the other rank.
splits = [3, 3]
splits[rank] = rank + 1
x = torch.full((sum(splits), 4), float(rank))
out_splits = [0, 0]
out_splits[rank] = rank + 1
out_splits[1 - rank] = 3
out = torch.empty(sum(out_splits), 4)
dist.all_to_all_single(out, x, output_split_sizes=out_splits, input_split_sizes=splits)
after_a2a = owner.comm_bytes
shard = torch.full((5,), float(rank))
gathered = torch.empty(10)
dist.all_gather_into_tensor(gathered, shard)
after_gather = owner.comm_bytes
counter.restore()
dist.all_to_all_single(out, x, output_split_sizes=out_splits, input_split_sizes=splits)
if rank == 0:
    print(json.dumps({"a2a": after_a2a, "gather": after_gather - after_a2a, "after_restore": owner.comm_bytes,
                      "restored": dist.all_to_all_single is original, "gathered": gathered.tolist(),
                      "received": out[:, 0].tolist()}))
dist.destroy_process_group()
'''


@pytest.mark.slow
def test_library_collectives_are_counted_as_comm_counts_them(tmp_path):
    script = tmp_path / "count.py"
    script.write_text(COUNT_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script)], capture_output=True, text=True, timeout=120, env=env, cwd=HERE.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["a2a"] == 3 * 4 * 4            # rank 0 keeps its 1 row, sends 3 rows of 4 float32
    assert got["gather"] == 5 * 4             # (W - 1) shards of 5 float32
    assert got["after_restore"] == got["a2a"] + got["gather"] and got["restored"]
    assert got["gathered"] == [0.0] * 5 + [1.0] * 5       # the wrapped calls still did their work
    assert got["received"] == [0.0, 1.0, 1.0, 1.0]
