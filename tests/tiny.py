"""The smallest problem the tests measure, spelled once: a test names only what it varies.

``grid(...)`` is a CPU config (one kernel, two masks, 64 tokens, a 2-head GQA-free shape, two timed
calls, no CP cells); ``cell(...)`` a kernel cell's settings of the same shape, as the rules pass them
to ``run-cell`` (without the kernel, which the test names); ``cp_cell(...)`` a CP cell's, as they
pass them to ``cp-cell`` (ring over two gloo ranks, causal, 256 tokens, ``sdpa_math`` blocks)."""

SHAPE = {"batch": 1, "heads_q": 2, "heads_kv": 2, "head_dim": 16, "gate_seqlen": 64}


def grid(**overrides) -> dict:
    """An override of None leaves the key out (the config's default then applies)."""
    config = {"device": "cpu", "threads": 1, "kernels": ["sdpa"], "masks": ["full", "causal"], "seqlens": [64],
              "directions": ["fwd"], "dtypes": ["float32"], **SHAPE, "seed": 0,
              "timing": {"warmup": 1, "reps": 2}, "cp_strategies": [], **overrides}
    return {key: value for key, value in config.items() if value is not None}


def cell(**overrides) -> dict:
    return {"mask": "causal", "seqlen": 64, "direction": "fwd", "dtype": "float32", **SHAPE,
            "warmup": 1, "reps": 2, "device": "cpu", **overrides}


def cp_cell(**overrides) -> dict:
    return {"strategy": "ring", "mask": "causal", "seqlen": 256, "cp_size": 2, "heads_q": 4, "heads_kv": 2,
            "head_dim": 16, "gate_seqlen": 128, "reps": 2, "warmup": 0, "device": "cpu",
            "strategy_options": {"local_kernel": "sdpa_math"}, **overrides}
