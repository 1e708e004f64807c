"""The Triton block-sparse kernel, on CPU through Triton's interpreter (``TRITON_INTERPRET=1``).

Three layers: the tile layout (pure numpy, exact against the dense mask), the kernels (forward
and dq/dk/dv against the float64 reference for many masks, GQA, dtypes, ragged lengths), and the
adapter (supports/unsupported reasons, notes, one real cell through ``run_cell``).  The
interpreter runs each program as numpy ops, so shapes stay small (seqlen ≤ 512).
"""

from __future__ import annotations

import importlib
import json
import os
import sys

import numpy as np
import pytest
import torch

from longca import kernels
from longca.attention import masks, reference
from longca.attention.mask_convert import block_sparsity
from longca.attention.problem import Problem
from longca.execution.measure.cell import CellSpec, run_cell
from longca.kernels import triton_block_sparse as tbs  # noqa: E402  (imports no triton)
from longca.kernels.triton_block_sparse import Config, build_layout  # noqa: E402


def _import_triton_interpreted():
    """Import triton with TRITON_INTERPRET=1, then restore the environment.

    Triton decides at import time whether its own library functions (``tl.zeros`` …) are
    interpreted, so the variable must be set when triton is first imported in this process.  If
    something (e.g. torch.compile) already imported it for compiled use, it is imported afresh.
    Outside this module's tests the variable is unset again, so other tests never see the kernel
    as runnable on CPU."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        if "triton" in sys.modules:
            from triton.runtime.interpreter import InterpretedFunction

            if not isinstance(sys.modules["triton"].language.zeros, InterpretedFunction):
                for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
                    del sys.modules[name]
        return importlib.import_module("triton")
    except ImportError as exc:
        pytest.skip(f"triton is not installed: {exc}", allow_module_level=True)
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old


triton = _import_triton_interpreted()


@pytest.fixture(autouse=True, scope="module")
def interpret():
    """TRITON_INTERPRET=1 while this module's tests run, and only then."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    yield
    if old is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = old


CUSTOM = [[0, 4, 0, 4, "causal"], [4, 8, 0, 4, "full"], [4, 8, 4, 8, "bi_causal"],
          [8, 16, 2, 9, "inv_causal"], [8, 16, 9, 16, "causal"]]


def _masks() -> list[masks.AttnMask]:
    """Every slice kind, rows in several slices, ragged documents, lengths not a multiple of
    any tile, and a rectangular mask."""
    out = []
    for n in (128, 300):
        out += [masks.build("full", n), masks.build("causal", n),
                masks.build("varlen_causal", n, seed=3),
                masks.build("sliding_window", n, window=37),
                masks.build("sliding_window_causal", n, window=50),
                masks.build("shared_question", n, seed=1),
                masks.build("global_sliding_window", n, window=21, global_tokens=9),
                masks.build("prefix_lm_varlen", n, seed=2)]
    out.append(masks.build("varlen_causal", 300, documents=[1, 63, 64, 7, 100, 65]))
    for density in (0.1, 0.5):
        for causal in (False, True):
            out.append(masks.build("block_sparse", 512, block=64, density=density,
                                   causal=causal, seed=1))
    out.append(masks.build("block_sparse", 256, block=16, density=0.3, seed=2))
    out.append(masks.build("custom", 256, slices=CUSTOM))
    out.append(masks.from_slices("rect", 200, 333, [[0, 100, 0, 150, "causal"],
                                                    [100, 200, 150, 333, "inv_causal"],
                                                    [0, 100, 200, 333, "full"]]))
    return out


def _tile_truth(mask: masks.AttnMask, bm: int, bn: int) -> torch.Tensor:
    """0 skipped / 1 partial / 2 full per tile, by brute force on the dense mask.  A tile that
    sticks out past seqlen_k is never full (the full-tile path does no bounds checks)."""
    sq, sk = mask.seqlen_q, mask.seqlen_k
    nqb, nkb = -(-sq // bm), -(-sk // bn)
    attended = torch.zeros(nqb * bm, nkb * bn, dtype=torch.bool)
    valid = torch.zeros_like(attended)
    attended[:sq, :sk] = mask.to_dense()
    valid[:sq, :sk] = True
    count = attended.reshape(nqb, bm, nkb, bn).sum((1, 3))
    capacity = valid.reshape(nqb, bm, nkb, bn).sum((1, 3))
    inside = (torch.arange(nkb) + 1) * bn <= sk
    full = (count == capacity) & inside[None, :]
    return torch.where(count == 0, 0, torch.where(full, 2, 1)).to(torch.int8)


@pytest.mark.parametrize("bm,bn", [(16, 16), (32, 64), (64, 32), (128, 64)])
def test_layout_is_exact(bm, bn):
    for mask in _masks():
        layout = build_layout(mask, bm, bn)
        truth = _tile_truth(mask, bm, bn)
        assert torch.equal(layout.dense(), truth), (mask.name, bm, bn)
        assert torch.equal(layout.dense() > 0, block_sparsity(mask, bm, bn)[0])
        # The key-major lists hold the same tiles as the query-major ones.
        k_state = np.zeros((layout.n_qb, layout.n_kb), dtype=np.int8)
        kb = np.repeat(np.arange(layout.n_kb), np.diff(layout.k_full_ptr))
        k_state[layout.k_full_qb, kb] = 2
        kb = np.repeat(np.arange(layout.n_kb), np.diff(layout.k_part_ptr))
        k_state[layout.k_part_qb, kb] = 1
        assert np.array_equal(k_state, truth.numpy()), mask.name
        # Each partial tile's rules rebuild exactly its part of the dense mask.
        dense = torch.zeros(layout.n_qb * bm, layout.n_kb * bn, dtype=torch.bool)
        dense[: mask.seqlen_q, : mask.seqlen_k] = mask.to_dense()
        qbs = np.repeat(np.arange(layout.n_qb), np.diff(layout.q_part_ptr))
        for qb, kb, t in zip(qbs, layout.q_part_kb, layout.q_part_tile):
            rows = torch.arange(qb * bm, (qb + 1) * bm)[:, None]
            cols = torch.arange(kb * bn, (kb + 1) * bn)[None, :]
            got = torch.zeros(bm, bn, dtype=torch.bool)
            for q0, q1, k0, k1, dlo, dhi in layout.rules[layout.rule_ptr[t]: layout.rule_ptr[t + 1]].tolist():
                lo = torch.clamp(rows + dlo, min=k0)
                hi = torch.clamp(rows + dhi, max=k1)
                got |= (rows >= q0) & (rows < q1) & (cols >= lo) & (cols < hi)
            assert torch.equal(got, dense[qb * bm: (qb + 1) * bm, kb * bn: (kb + 1) * bn])


def test_layout_counts_and_union_promotion():
    # Causal at 256 with 64×64 tiles: 4 diagonal partial tiles, 6 full below, 6 skipped above.
    stats = build_layout(masks.build("causal", 256), 64, 64).stats()
    assert (stats["tiles_full"], stats["tiles_partial"], stats["tiles_skipped"]) == (6, 4, 6)
    # Two FULL slices meeting mid-tile cover it together: promoted to full, no rules kept.
    split = masks.from_slices("split", 64, 64, [[0, 64, 0, 40, "full"], [0, 64, 40, 64, "full"]])
    stats = build_layout(split, 64, 64).stats()
    assert (stats["tiles_full"], stats["tiles_partial"], stats["partial_rules"]) == (1, 0, 0)
    # block_sparse tiles aligned with the kernel's tiles: no partial tile at all (non-causal).
    bs = masks.build("block_sparse", 512, block=64, density=0.25, seed=0)
    stats = build_layout(bs, 64, 64).stats()
    assert stats["tiles_partial"] == 0
    assert stats["tile_density"] == pytest.approx(bs.params["block_density"])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    assert torch.isfinite(a).all()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


# Tolerances on the relative L2 error vs the float64 reference.  In the interpreter every tile
# is computed in fp32 (see the module docstring), so fp32 inputs agree to ~1e-6 (summation order
# only); bf16/fp16 inputs are exact in fp32, and the only rounding is the output's store
# (bf16: 8 mantissa bits, and the interpreter truncates, ≤ 2^-8 relative; fp16: 2^-11).
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _check(mask, *, hq=4, hk=2, d=32, dtype=torch.float32, batch=1, cfg=None, backward=True,
           seed=0):
    gen = torch.Generator().manual_seed(seed)
    sq, sk = mask.seqlen_q, mask.seqlen_k
    q = torch.randn(batch, sq, hq, d, generator=gen).to(dtype).requires_grad_(backward)
    k = torch.randn(batch, sk, hk, d, generator=gen).to(dtype).requires_grad_(backward)
    v = torch.randn(batch, sk, hk, d, generator=gen).to(dtype).requires_grad_(backward)
    prepared = tbs.prepare(mask, "cpu", d, cfg or Config(fwd_m=32, fwd_n=64, bwd_m=64, bwd_n=32))
    out = tbs.attention(q, k, v, prepared)
    q64, k64, v64 = (t.detach().double().requires_grad_(backward) for t in (q, k, v))
    ref = reference.attention(q64, k64, v64, mask)
    tol = TOL[dtype]
    errors = {"out": _rel(out, ref)}
    if backward:
        grad = torch.randn(out.shape, generator=gen).to(dtype)
        got = torch.autograd.grad(out, (q, k, v), grad)
        want = torch.autograd.grad(ref, (q64, k64, v64), grad.double())
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            assert g.dtype == dtype and g.shape == w.shape
            errors[name] = _rel(g, w)
    assert max(errors.values()) <= tol, (mask.name, errors)
    return out


KERNEL_CASES = [
    ("full", masks.build("full", 200), {}),
    ("causal", masks.build("causal", 256), {}),
    ("varlen_causal_odd_docs", masks.build("varlen_causal", 300, documents=[1, 63, 64, 7, 100, 65]), {}),
    ("sliding_window_causal", masks.build("sliding_window_causal", 320, window=50), {}),
    ("global_sliding_window", masks.build("global_sliding_window", 192, window=21, global_tokens=9), {}),
    ("shared_question", masks.build("shared_question", 256, seed=1), {}),
    ("block_sparse_0.1", masks.build("block_sparse", 512, block=64, density=0.1, seed=1), {}),
    ("block_sparse_0.5_causal", masks.build("block_sparse", 512, block=64, density=0.5, causal=True, seed=1), {}),
    ("block_sparse_0.5", masks.build("block_sparse", 256, block=32, density=0.5, seed=4), {}),
    ("block_sparse_0.1_causal", masks.build("block_sparse", 256, block=32, density=0.1, causal=True, seed=4), {}),
    ("custom", masks.build("custom", 256, slices=CUSTOM), {}),
    ("rect", masks.from_slices("rect", 200, 333, [[0, 100, 0, 150, "causal"], [100, 200, 150, 333, "inv_causal"],
                                                  [0, 100, 200, 333, "full"]]), {}),
    ("bf16_gqa_4to1_d64", masks.build("causal", 192), dict(dtype=torch.bfloat16, hq=4, hk=1, d=64)),
    ("fp16_batch2_d16", masks.build("varlen_causal", 160, seed=5), dict(dtype=torch.float16, batch=2, hq=2, hk=2, d=16)),
    ("fp32_mha_tiles16", masks.build("sliding_window", 100, window=9), dict(hq=2, hk=2, cfg=Config(16, 16, 1, 1, 16, 32, 1, 1))),
]


@pytest.mark.parametrize("name,mask,kw", KERNEL_CASES, ids=[c[0] for c in KERNEL_CASES])
def test_kernel_matches_reference(name, mask, kw):
    _check(mask, **kw)


def test_rows_without_keys_give_zeros():
    # Rows 4..7 and 12..15 attend nothing (at every scale): output and dq are 0 there, no NaN.
    mask = masks.build("custom", 128, slices=[[0, 4, 0, 4, "causal"], [8, 12, 0, 16, "full"]])
    out = _check(mask, hq=2, hk=1)
    assert out[:, 32:64].abs().max() == 0 and out[:, 96:].abs().max() == 0


def test_noncontiguous_inputs():
    # (b, h, s, d) storage viewed as (b, s, h, d): strides are passed, nothing is copied.
    mask = masks.build("causal", 96)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 96, 32, generator=gen).transpose(1, 2) for _ in range(3))
    out = tbs.attention(q, k, v, tbs.prepare(mask, "cpu", 32, Config(32, 32, 1, 1, 32, 32, 1, 1)))
    assert _rel(out, reference.attention(q.double(), k.double(), v.double(), mask)) < 1e-5


def _problem(direction="fwd", device="cpu", dtype=torch.bfloat16, head_dim=32, mask="causal",
             seqlen=128, **params):
    return Problem(mask, seqlen, 1, 4, 2, head_dim, dtype, torch.device(device), direction,
                   mask_params=params)


def test_adapter_registered_and_supports():
    kernel = kernels.get("triton_block_sparse")
    assert "triton_block_sparse" in kernels.names()
    assert kernel.available() is None
    assert kernel.supports(_problem()) is None
    assert kernel.supports(_problem("bwd")) is None
    assert "head_dim" in kernel.supports(_problem(head_dim=48))
    assert "float64" in kernel.supports(_problem(dtype=torch.float64))


def test_adapter_cpu_needs_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    kernel = kernels.get("triton_block_sparse")
    if not torch.cuda.is_available():
        assert "CUDA" in kernel.available()
    reason = kernel.supports(_problem())
    assert reason and ("TRITON_INTERPRET" in reason or "CUDA" in reason)


def test_notes_report_tiles():
    kernel = kernels.get("triton_block_sparse")
    problem = _problem(mask="block_sparse", seqlen=256, block=64, density=0.5)
    notes = kernel.notes(kernel.prepare(problem))
    json.dumps(notes)
    assert notes["tiles_full"] + notes["tiles_partial"] + notes["tiles_skipped"] == 16
    assert notes["tile_density"] == pytest.approx(problem.mask.params["block_density"])


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_cell_is_ok(direction):
    spec = CellSpec(kernel="triton_block_sparse", mask="block_sparse", seqlen=256, direction=direction,
                    dtype="bfloat16", heads_q=4, heads_kv=2, head_dim=32, gate_seqlen=256,
                    mask_params={"block": 64, "density": 0.25, "causal": True}, warmup=0, reps=1)
    row = run_cell(spec)
    assert row["status"] == "ok", row["reason"]
    assert row["gate_error"] <= row["gate_tolerance"]
    notes = json.loads(row["notes"])
    assert notes["tiles_skipped"] > 0 and notes["tiles_partial"] == 4


def test_options_choose_tiles():
    kernel = kernels.get("triton_block_sparse").with_options({"fwd_m": 32, "fwd_n": 16})
    problem = _problem(mask="causal", seqlen=96)
    notes = kernel.notes(kernel.prepare(problem))
    assert (notes["tile_m"], notes["tile_n"]) == (32, 16)
    assert "power of two" in kernels.get("triton_block_sparse").with_options({"bwd_n": 24}).supports(problem)
    with pytest.raises(ValueError):
        kernels.get("triton_block_sparse").with_options({"tile": 3})
