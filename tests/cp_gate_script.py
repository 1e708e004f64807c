"""Run under torchrun by tests/test_cp_distributed.py: the CP correctness gate for every strategy ×
mask × dtype × direction in one process group, one JSON line per case on rank 0."""

import json
import sys

import torch
import torch.distributed as dist

from longca import cp
from longca.cp.base import Unsupported
from longca.cp.runner import CPSpec, correctness_gate

MASKS = {
    "full": {},
    "causal": {},
    "varlen_full": {"histogram": {"edges": [16, 48, 160], "weights": [1, 1]}},
    "varlen_causal": {"histogram": {"edges": [16, 48, 160], "weights": [1, 1]}},
    "sliding_window_causal": {"window": 40},
    "shared_question": {"histogram": {"edges": [16, 48, 160], "weights": [1, 1]}},
}


def main() -> None:
    out_path, seqlen = sys.argv[1], int(sys.argv[2])
    strategies = sys.argv[3].split(",") if len(sys.argv) > 3 else cp.names()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.set_num_threads(1)
    lines = []
    for strategy in strategies:
        for mask, params in MASKS.items():
            for dtype in ("float32", "bfloat16"):
                for direction in ("fwd", "bwd"):
                    spec = CPSpec(strategy, mask, seqlen, world, direction, dtype, heads_q=8, heads_kv=2,
                                  head_dim=16, mask_params=params, seed=3)
                    problem = spec.problem(torch.device("cpu"))
                    try:
                        ok, err, tol, detail = correctness_gate(spec, problem)
                        result = {"status": "ok" if ok else "wrong", "error": err, "tolerance": tol,
                                  "detail": detail}
                    except Unsupported as exc:
                        result = {"status": "unsupported", "reason": str(exc)}
                    lines.append({"strategy": strategy, "mask": mask, "dtype": dtype, "direction": direction,
                                  **result})
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
