"""Run under torchrun by tests/test_cp_exposed_comm.py: every collective of ``longca.cp.comm`` in
local-copy mode, on inputs filled with the rank's own value, and every LongCA strategy's forward and
backward in that mode; rank 0 writes one JSON object of what each rank saw.

    cp_local_copy_script.py OUT
"""

import json
import sys

import torch
import torch.distributed as dist

from longca import cp
from longca.cp.comm import Comm, LocalCopyViolation, all_to_all_uneven, local_copies
from longca.execution.measure.cp_cell import CPSpec

OURS = ["allgather", "double_ring", "groupcast", "ring", "ulysses", "usp"]


def values(t: torch.Tensor) -> list[float]:
    return sorted({float(x) for x in t.flatten().tolist()})


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = float(rank + 1)
    comm = Comm(None)
    seen: dict = {}
    with local_copies():
        x = torch.full((3, 5), mine)
        gathered = comm.all_gather(x)
        seen["all_gather"] = {"shape": list(gathered.shape), "values": values(gathered)}
        parts = torch.full((world, 2, 4), mine)
        got = comm.all_to_all(parts)
        seen["all_to_all"] = {"shape": list(got.shape), "values": values(got)}
        reduced = comm.reduce_scatter(torch.full((world, 6), mine))
        seen["reduce_scatter"] = {"shape": list(reduced.shape), "values": values(reduced)}
        # A ring hop: this rank's K and V into the receive buffers of the same sizes.
        sends = [torch.full((2, 3), mine), torch.full((4,), mine, dtype=torch.float64)]
        recvs = [torch.full((2, 3), -1.0), torch.full((4,), -1.0, dtype=torch.float64)]
        works = comm.exchange(sends, (rank + 1) % world, recvs, (rank - 1) % world)
        comm.wait(works)
        seen["exchange"] = {"shape": [list(r.shape) for r in recvs],
                            "values": sorted({x for r in recvs for x in values(r)})}
        # groupcast's uneven all-to-all: more rows received than sent.
        x_rows = torch.full((3, 2), mine)
        out_rows = torch.full((5, 2), -1.0)
        work = all_to_all_uneven(out_rows, x_rows, [2, 3], [1, 2], None)
        work.wait()
        seen["all_to_all_uneven"] = {"shape": list(out_rows.shape), "values": values(out_rows)}
        try:
            dist.all_reduce(torch.zeros(1))
            seen["direct_all_reduce"] = "ran"
        except LocalCopyViolation as exc:
            seen["direct_all_reduce"] = str(exc)
    # Every LongCA strategy's forward and backward run without a collective outside longca.cp.comm
    # (planning, which makes sub-groups, outside the mode, as a cell plans untimed).
    results = {}
    for name in OURS:
        spec = CPSpec(strategy=name, cp_size=world, mask="causal", seqlen=128, heads_q=4, heads_kv=2,
                      head_dim=8, direction="bwd", strategy_options={"local_kernel": "sdpa_math"})
        problem = spec.problem()
        strategy = cp.build(name, None, spec.strategy_options)
        strategy.plan(problem.mask, problem.heads_q, problem.heads_kv, problem.head_dim, problem.device, problem.dtype)
        q, k, v, dout = problem.make_inputs(requires_grad=False, seed=1)
        ql, kl, vl = (strategy.dispatch(t).requires_grad_(True) for t in (q, k, v))
        try:
            with local_copies():
                out = strategy.attention(ql, kl, vl)
                torch.autograd.grad(out, (ql, kl, vl), strategy.dispatch(dout))
            results[name] = "ok"
        except LocalCopyViolation as exc:
            results[name] = str(exc)
        strategy.close()
    seen["steps"] = results
    # Out of the mode, the collectives move data again.
    seen["after"] = values(comm.all_gather(torch.full((2,), mine)))
    every = [None] * world
    dist.all_gather_object(every, seen)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(every, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
