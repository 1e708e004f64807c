import json, time, sys
from longca.api import CellSpec, run_cell
base = dict(heads_q=64, heads_kv=8, head_dim=128, dtype="bfloat16", device="cuda", warmup=1, reps=5, warmup_ms=25.0,
            warmup_max_ms=1000.0, rep_ms=100.0, cuda_graph=True, gate_seqlen=1024, seed=1)
cells = [("sdpa_cudnn", "sliding_window", "fwd"), ("sdpa_cudnn", "sliding_window_causal", "bwd"), ("sdpa", "varlen_causal", "fwd"),
         ("sdpa_efficient", "prefix_lm_causal", "fwd"), ("sdpa_cudnn", "shared_question", "fwd"), ("sdpa_cudnn", "global_sliding_window", "bwd")]
for kernel, mask, d in cells:
    row = run_cell(CellSpec(kernel=kernel, mask=mask, seqlen=32768, direction=d, **base))
    print(json.dumps({k: row.get(k) for k in ("kernel", "mask", "direction", "status", "wall_s", "gate_wall_s", "time_wall_s",
          "memory_wall_s", "median_ms", "peak_mem_bytes", "warmup_spent_ms", "reps", "reason")}), flush=True)
