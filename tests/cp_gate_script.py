"""Run under torchrun by tests/test_cp_distributed.py: the CP correctness gate for every strategy ×
mask × dtype × direction in one process group, one JSON line per case on rank 0.

    cp_gate_script.py OUT SEQLEN [STRATEGIES] [MASKS] [--layouts] [--pieces] [--heads=Q,KV] [--options=JSON]

``--layouts`` runs `usp` at every Ulysses degree and `double_ring` at every window that divides the
world size (each rank grid the 2-D strategies can take), instead of their default layout.
``--pieces`` makes the local kernel run each block as pieces (``local_calls: pieces``) instead of
one call per block.  ``--heads`` sets the query and KV heads (default 8, 2); ``--options`` adds
strategy options (a JSON object) to every case."""

import json
import sys

import torch
import torch.distributed as dist

from longca import cp
from longca.cp.base import Unsupported
from longca.execution.measure.cp_cell import CPSpec, correctness_gate

MASKS = {
    "full": {},
    "causal": {},
    "varlen_full": {"histogram": {"edges": [16, 48, 160], "weights": [1, 1]}},
    "varlen_causal": {"histogram": {"edges": [16, 48, 160], "weights": [1, 1]}},
    "sliding_window_causal": {"window": 40},
    "shared_question": {"histogram": {"edges": [16, 48, 160], "weights": [1, 1]}},
}


# The strategies whose blocks go through longca.cp.local (the others take no local_calls option).
LOCAL_CALLS = ("allgather", "double_ring", "groupcast", "ring", "ulysses", "usp")

# The option that sets each 2-D strategy's rank grid (see longca/cp/usp.py, double_ring.py).
LAYOUT_OPTION = {"usp": "ulysses_degree", "double_ring": "window"}


def layouts(strategy: str, world: int, all_layouts: bool) -> list[dict]:
    if not all_layouts or strategy not in LAYOUT_OPTION:
        return [{}]
    return [{LAYOUT_OPTION[strategy]: d} for d in range(1, world + 1) if world % d == 0]


def main() -> None:
    flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    all_layouts = "--layouts" in sys.argv
    calls = {"local_calls": "pieces"} if "--pieces" in sys.argv else {}
    heads_q, heads_kv = (int(h) for h in flags.get("heads", "8,2").split(","))
    extra = json.loads(flags.get("options", "{}"))
    out_path, seqlen = args[0], int(args[1])
    strategies = args[2].split(",") if len(args) > 2 else cp.names()
    masks = {m: MASKS[m] for m in args[3].split(",")} if len(args) > 3 else MASKS
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.set_num_threads(1)
    lines = []
    runs = [(strategy, options) for strategy in strategies for options in layouts(strategy, world, all_layouts)]
    for strategy, options in runs:
        for mask, params in masks.items():
            for dtype in ("float32", "bfloat16"):
                for direction in ("fwd", "bwd"):
                    spec = CPSpec(strategy=strategy, mask=mask, seqlen=seqlen, cp_size=world, direction=direction,
                                  dtype=dtype, heads_q=heads_q, heads_kv=heads_kv,
                                  head_dim=16, mask_params=params, seed=3,
                                  strategy_options={**options, **extra,
                                                    **(calls if strategy in LOCAL_CALLS else {})})
                    problem = spec.problem(torch.device("cpu"))
                    try:
                        ok, err, tol, detail = correctness_gate(spec, problem)
                        result = {"status": "ok" if ok else "wrong", "error": err, "tolerance": tol,
                                  "detail": detail}
                    except Unsupported as exc:
                        result = {"status": "unsupported", "reason": str(exc)}
                    lines.append({"strategy": strategy, "options": options, "mask": mask, "dtype": dtype,
                                  "direction": direction, **result})
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
