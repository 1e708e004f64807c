"""A block-sparse flash-attention kernel written in Triton, for any LongCA mask.

The mask's slices are turned, outside the timed region, into a tile layout over
``BLOCK_M × BLOCK_N`` tiles of the ``seqlen_q × seqlen_k`` score matrix:

* **full** tiles — every (q, k) pair attended: computed with no element-wise mask;
* **partial** tiles — some pairs attended: the kernel rebuilds the tile's boolean mask from the
  *slice rules* that touch the tile (see below) and applies it to the scores;
* **skipped** tiles — nothing attended: never loaded, never computed.

Partial tiles carry a short list of slice rules (``q_start, q_end, k_start, k_end, dlo, dhi``):
row ``q`` of a rule attends the single key interval ``[max(k_start, q + dlo), min(k_end, q + dhi))``
when ``q_start ≤ q < q_end`` (FULL: ``dlo = −∞, dhi = +∞``; CAUSAL: ``dhi = k_end − q_end + 1``;
INV_CAUSAL: ``dlo = k_start − q_start``; BI_CAUSAL: both).  That is exact for every mask — every
row of every slice attends one contiguous key interval (``AttnSlice.key_bounds``), and a row that
belongs to several slices simply gets several rules, OR-ed.  The list of a tile holds only the
slices that touch it, so the metadata grows with the slices' perimeter in tiles, not with the
tile area (no dense ``BLOCK_M × BLOCK_N`` bitmap is stored).  A tile touched by several slices
whose union still covers it is promoted to full by an exact per-row count.

Kernels: forward (online softmax in fp32, exp2 domain, guarded: rows that attend no key give 0
output and a +∞ "LSE" so that their backward probabilities are 0), and backward as two kernels —
dK/dV (one program per key tile and KV head, looping over the query heads of its GQA group and
the query tiles that attend it; no atomics) and dQ (one program per query tile and query head).
GQA is in-kernel: query head ``h`` reads KV head ``h // (heads_q // heads_kv)``; KV is never
expanded.  Tensors stay ``(batch, seqlen, heads, head_dim)``: strides are passed, no transposes.

On CPU the kernels run only under ``TRITON_INTERPRET=1`` (Triton's interpreter, for tests).  The
interpreter multiplies the raw bit patterns of bfloat16 in ``tl.dot`` (it stores bf16 as uint16),
so in interpret mode every tile is upcast to fp32 after loading (``INTERPRET``); on a GPU the
dots run in the input dtype on tensor cores with fp32 accumulation (fp32 inputs: IEEE fp32 dots).

Triton is imported lazily (``_triton()``): a machine without it gets ``unsupported`` cells with the
reason, never an import error.  The jitted functions are defined inside ``_build`` and published as
module globals, because Triton's interpreter looks ``triton.language`` up in the module's globals
and whether a function is interpreted is decided when it is decorated.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..attention.masks import AttnMask, SliceKind
from ..attention.problem import Problem
from . import register
from .base import Kernel

# A sentinel "no bound" for the diagonal offsets of FULL rules; sequence positions stay < 2**30
# so ``q + dlo`` / ``q + dhi`` never overflow int32.
_INF_OFFSET = 1 << 30
_MAX_SEQLEN = 1 << 30
HEAD_DIMS = (16, 32, 64, 128, 256)


def interpret_mode() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ---------------------------------------------------------------------------------------------
# Tile layout: built from the slices with numpy (untimed), O(slices + touched tiles).
# ---------------------------------------------------------------------------------------------

@dataclass
class TileLayout:
    """Which ``block_m × block_n`` tiles a kernel visits and how.

    Query-major CSR (forward, dQ): tiles of query block ``m`` are ``q_full_kb[q_full_ptr[m]:
    q_full_ptr[m+1]]`` and ``q_part_kb/q_part_tile[q_part_ptr[m]:q_part_ptr[m+1]]``.  Key-major
    CSR (dK/dV): the same with ``k_*`` and query blocks.  Partial tile ``t`` owns the rules
    ``rules[rule_ptr[t]:rule_ptr[t+1]]`` (int32 ``[n, 6]``: q_start, q_end, k_start, k_end, dlo,
    dhi).  ``q_order`` lists query blocks by decreasing work (heaviest programs start first)."""

    block_m: int
    block_n: int
    seqlen_q: int
    seqlen_k: int
    n_qb: int
    n_kb: int
    q_full_ptr: np.ndarray
    q_full_kb: np.ndarray
    q_part_ptr: np.ndarray
    q_part_kb: np.ndarray
    q_part_tile: np.ndarray
    k_full_ptr: np.ndarray
    k_full_qb: np.ndarray
    k_part_ptr: np.ndarray
    k_part_qb: np.ndarray
    k_part_tile: np.ndarray
    rule_ptr: np.ndarray
    rules: np.ndarray
    q_order: np.ndarray
    k_order: np.ndarray

    @property
    def n_full(self) -> int:
        return int(self.q_full_kb.size)

    @property
    def n_partial(self) -> int:
        return int(self.q_part_kb.size)

    @property
    def n_tiles(self) -> int:
        return self.n_qb * self.n_kb

    def stats(self) -> dict[str, Any]:
        per_tile = np.diff(self.rule_ptr)
        return {
            "tiles_full": self.n_full,
            "tiles_partial": self.n_partial,
            "tiles_skipped": self.n_tiles - self.n_full - self.n_partial,
            "tile_density": (self.n_full + self.n_partial) / self.n_tiles,
            "partial_rules": int(self.rules.shape[0]),
            "max_rules_per_tile": int(per_tile.max()) if per_tile.size else 0,
        }

    def to(self, device: torch.device | str) -> dict[str, torch.Tensor]:
        names = ("q_full_ptr", "q_full_kb", "q_part_ptr", "q_part_kb", "q_part_tile", "k_full_ptr",
                 "k_full_qb", "k_part_ptr", "k_part_qb", "k_part_tile", "rule_ptr", "q_order",
                 "k_order")
        out = {n: torch.as_tensor(np.ascontiguousarray(getattr(self, n), dtype=np.int32)).to(device)
               for n in names}
        rules = self.rules if self.rules.size else np.zeros((1, 6), dtype=np.int32)
        out["rules"] = torch.as_tensor(np.ascontiguousarray(rules, dtype=np.int32)).to(device)
        return out

    def dense(self) -> torch.Tensor:
        """Per-tile state ``[n_qb, n_kb]``: 0 skipped, 1 partial, 2 full (for tests/inspection)."""
        out = np.zeros((self.n_qb, self.n_kb), dtype=np.int8)
        qb_full = np.repeat(np.arange(self.n_qb), np.diff(self.q_full_ptr))
        out[qb_full, self.q_full_kb] = 2
        qb_part = np.repeat(np.arange(self.n_qb), np.diff(self.q_part_ptr))
        out[qb_part, self.q_part_kb] = 1
        return torch.from_numpy(out)


def _slice_rules(mask: AttnMask) -> np.ndarray:
    """int64 ``[n_slices, 6]``: q_start, q_end, k_start, k_end, dlo, dhi (see module docstring)."""
    rows = []
    for s in mask.slices:
        dlo, dhi = -_INF_OFFSET, _INF_OFFSET
        if s.kind in (SliceKind.INV_CAUSAL, SliceKind.BI_CAUSAL):
            dlo = s.k_start - s.q_start                   # j ≥ i   ⇔ k ≥ q + (k_start − q_start)
        if s.kind in (SliceKind.CAUSAL, SliceKind.BI_CAUSAL):
            dhi = s.k_end - s.q_end + 1                   # j ≤ i + lk − lq ⇔ k < q + (k_end − q_end + 1)
        rows.append((s.q_start, s.q_end, s.k_start, s.k_end, dlo, dhi))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 6)


def _ranges(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Expand half-open ranges: (index of the range, value) for every value of every range."""
    lengths = np.maximum(ends - starts, 0)
    owner = np.repeat(np.arange(starts.size), lengths)
    offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return owner, np.repeat(starts, lengths) + offsets


def _csr(major: np.ndarray, minor: np.ndarray, n_major: int, *extra: np.ndarray):
    order = np.lexsort((minor, major))
    ptr = np.zeros(n_major + 1, dtype=np.int64)
    np.cumsum(np.bincount(major, minlength=n_major), out=ptr[1:])
    return (ptr, minor[order], *(e[order] for e in extra))


def build_layout(mask: AttnMask, block_m: int, block_n: int) -> TileLayout:
    """Classify every tile of ``mask`` as full / partial / skipped (exactly) and list the rules
    of the partial ones.  Cost: O(slices × query blocks per slice + touched tiles)."""
    sq, sk = mask.seqlen_q, mask.seqlen_k
    if max(sq, sk) >= _MAX_SEQLEN:
        raise ValueError(f"sequence length {max(sq, sk)} exceeds the kernel's int32 indexing")
    n_qb, n_kb = -(-sq // block_m), -(-sk // block_n)
    rules = _slice_rules(mask)
    qs, qe, ks, ke, dlo, dhi = rules.T

    def lo_of(i, r):
        return np.maximum(ks[i], r + dlo[i])

    def hi_of(i, r):
        return np.minimum(ke[i], r + dhi[i])

    # One entry per (slice, query block it spans).
    first_qb, last_qb = qs // block_m, (qe - 1) // block_m
    si, qb = _ranges(first_qb, last_qb + 1)
    r0 = qb * block_m                                  # the tile's rows: [r0, r1)
    r1 = np.minimum(r0 + block_m, sq)
    a, b = np.maximum(r0, qs[si]), np.minimum(r1, qe[si])  # rows of the slice in the tile
    # Rows whose interval is non-empty form a contiguous run (lo, hi are non-decreasing and lo
    # grows by at most 1 per row); clip to it, as mask_convert.block_sparsity does.
    causal_like = dhi[si] != _INF_OFFSET
    inv_like = dlo[si] != -_INF_OFFSET
    a = np.where(causal_like, np.maximum(a, qe[si] - (ke[si] - ks[si])), a)
    b = np.where(inv_like, np.minimum(b, qs[si] + (ke[si] - ks[si])), b)
    touched = (a < b) & (lo_of(si, a) < hi_of(si, a))
    # Touched key blocks: [lo(first row), hi(last row)) is one contiguous key range.
    t0 = np.where(touched, lo_of(si, a) // block_n, 0)
    t1 = np.where(touched, (hi_of(si, np.maximum(b - 1, 0)) - 1) // block_n + 1, 0)
    # Key blocks this slice covers alone: all tile rows inside the slice, and every row's
    # interval ⊇ the tile's columns (lo is largest at the last row, hi smallest at the first);
    # the tile must also lie inside [0, seqlen_k).
    rows_in = (qs[si] <= r0) & (r1 <= qe[si])
    c_lo = lo_of(si, r1 - 1)
    c_hi = np.minimum(hi_of(si, r0), (sk // block_n) * block_n)
    f0 = -(-c_lo // block_n)
    f1 = np.where(rows_in & touched, c_hi // block_n, f0)
    f1 = np.maximum(f1, f0)
    f0, f1 = np.clip(f0, t0, t1), np.clip(f1, t0, t1)
    # Full tiles: [f0, f1); partial (slice, tile) pairs: [t0, f0) and [f1, t1).
    own, kb_full = _ranges(f0, f1)
    full_qb, full_kb = qb[own], kb_full
    own_l, kb_l = _ranges(t0, f0)
    own_r, kb_r = _ranges(f1, t1)
    p_own = np.concatenate([own_l, own_r])
    p_qb = qb[p_own]
    p_kb = np.concatenate([kb_l, kb_r])
    p_slice = si[p_own]

    # Group the partial pairs by tile; count each tile's attended pairs exactly and promote the
    # tiles that several slices cover together to full.
    key = p_qb * n_kb + p_kb
    order = np.argsort(key, kind="stable")
    key, p_slice = key[order], p_slice[order]
    tiles, start = np.unique(key, return_index=True)
    tile_of_pair = np.repeat(np.arange(tiles.size), np.diff(np.append(start, key.size)))
    counts = np.zeros(tiles.size, dtype=np.int64)
    chunk = max(1, (1 << 22) // block_m)
    rows_local = np.arange(block_m)
    for c in range(0, key.size, chunk):
        sl, kk = p_slice[c : c + chunk], key[c : c + chunk]
        rr = (kk // n_kb)[:, None] * block_m + rows_local[None, :]          # [pairs, block_m]
        c0 = (kk % n_kb) * block_n
        c1 = np.minimum(c0 + block_n, sk)
        lo = np.maximum(np.maximum(ks[sl][:, None], rr + dlo[sl][:, None]), c0[:, None])
        hi = np.minimum(np.minimum(ke[sl][:, None], rr + dhi[sl][:, None]), c1[:, None])
        inside = (rr >= qs[sl][:, None]) & (rr < qe[sl][:, None]) & (rr < sq)
        n = np.where(inside, np.maximum(hi - lo, 0), 0).sum(axis=1)
        np.add.at(counts, tile_of_pair[c : c + chunk], n)
    t_qb, t_kb = tiles // n_kb, tiles % n_kb
    capacity = (np.minimum((t_qb + 1) * block_m, sq) - t_qb * block_m) * block_n
    promote = (counts == capacity) & ((t_kb + 1) * block_n <= sk)
    full_qb = np.concatenate([full_qb, t_qb[promote]])
    full_kb = np.concatenate([full_kb, t_kb[promote]])
    keep = ~promote[tile_of_pair]
    pair_tile_new = np.cumsum(~promote) - 1          # new index of each kept tile
    part_qb, part_kb = t_qb[~promote], t_kb[~promote]
    kept_pairs_tile = pair_tile_new[tile_of_pair[keep]]
    rule_ptr = np.zeros(part_qb.size + 1, dtype=np.int64)
    np.cumsum(np.bincount(kept_pairs_tile, minlength=part_qb.size), out=rule_ptr[1:])
    tile_rules = rules[p_slice[keep]]                 # already grouped by tile (key order)

    q_full_ptr, q_full_kb = _csr(full_qb, full_kb, n_qb)
    k_full_ptr, k_full_qb = _csr(full_kb, full_qb, n_kb)
    part_ids = np.arange(part_qb.size)
    q_part_ptr, q_part_kb, q_part_tile = _csr(part_qb, part_kb, n_qb, part_ids)
    k_part_ptr, k_part_qb, k_part_tile = _csr(part_kb, part_qb, n_kb, part_ids)
    q_work = np.diff(q_full_ptr) + np.diff(q_part_ptr)
    k_work = np.diff(k_full_ptr) + np.diff(k_part_ptr)
    return TileLayout(
        block_m, block_n, sq, sk, n_qb, n_kb,
        q_full_ptr, q_full_kb, q_part_ptr, q_part_kb, q_part_tile,
        k_full_ptr, k_full_qb, k_part_ptr, k_part_qb, k_part_tile,
        rule_ptr, tile_rules.astype(np.int32),
        np.argsort(-q_work, kind="stable"), np.argsort(-k_work, kind="stable"))


# ---------------------------------------------------------------------------------------------
# Triton kernels (built lazily; see the module docstring).
# ---------------------------------------------------------------------------------------------

triton = None
tl = None
_BUILT_FOR: bool | None = None  # the interpret mode the kernels were decorated under


def _triton():
    """Import triton (or raise ImportError) and (re)build the jitted kernels for this mode."""
    global triton, tl, _BUILT_FOR
    if _BUILT_FOR is None or _BUILT_FOR != interpret_mode():
        import triton as _t
        import triton.language as _tl

        triton, tl = _t, _tl
        _build()
        _BUILT_FOR = interpret_mode()
    return triton


def _build() -> None:  # noqa: C901 — the kernels, published as module globals
    global _tile_mask, _tile_mask_t, _fwd_tile, _fwd_kernel, _dkdv_tile, _bwd_dkdv_kernel
    global _dq_tile, _bwd_dq_kernel

    # Loops whose bounds are loaded from the tile lists are written twice under the INTERPRET
    # constexpr: ``for … in range(lo, hi)`` on a GPU (software-pipelined by Triton) and a ``while``
    # loop in the interpreter, whose ``range`` cannot take a loaded scalar under numpy >= 2.4
    # (triton-lang/triton#9171).  The loop bodies are shared helpers.

    @triton.jit
    def _tile_mask(rules, r0, r1, rows, cols):
        """Bool [rows, cols]: OR over rules r0..r1 of ``q_start ≤ q < q_end ∧ lo(q) ≤ k < hi(q)``."""
        allowed = (rows[:, None] < 0) & (cols[None, :] < 0)
        r = r0
        while r < r1:
            p = rules + r * 6
            lo = tl.maximum(rows + tl.load(p + 4), tl.load(p + 2))
            hi = tl.minimum(rows + tl.load(p + 5), tl.load(p + 3))
            hi = tl.where((rows >= tl.load(p)) & (rows < tl.load(p + 1)), hi, lo)
            allowed = allowed | ((cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None]))
            r += 1
        return allowed

    @triton.jit
    def _tile_mask_t(rules, r0, r1, rows, cols):
        """Bool [cols, rows]: the transposed tile (dK/dV works in the key-major frame)."""
        allowed = (cols[:, None] < 0) & (rows[None, :] < 0)
        r = r0
        while r < r1:
            p = rules + r * 6
            lo = tl.maximum(rows + tl.load(p + 4), tl.load(p + 2))
            hi = tl.minimum(rows + tl.load(p + 5), tl.load(p + 3))
            hi = tl.where((rows >= tl.load(p)) & (rows < tl.load(p + 1)), hi, lo)
            allowed = allowed | ((cols[:, None] >= lo[None, :]) & (cols[:, None] < hi[None, :]))
            r += 1
        return allowed

    @triton.jit
    def _fwd_tile(acc, m_i, l_i, q, k_base, v_base, kb, offs_m, rules, r0, r1, s_ks, s_vs,
                  seqlen_k, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                  MASKED: tl.constexpr, INTERPRET: tl.constexpr, PRECISION: tl.constexpr):
        """One key tile of the online softmax (scores in the log2 domain)."""
        offs_d = tl.arange(0, HEAD_DIM)
        cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
        if MASKED:
            col_ok = cols < seqlen_k
            kt = tl.load(k_base + cols[None, :].to(tl.int64) * s_ks + offs_d[:, None],
                         mask=col_ok[None, :], other=0.0)
            v = tl.load(v_base + cols[:, None].to(tl.int64) * s_vs + offs_d[None, :],
                        mask=col_ok[:, None], other=0.0)
        else:
            # A full tile lies inside [0, seqlen_k): no bounds checks.
            kt = tl.load(k_base + cols[None, :].to(tl.int64) * s_ks + offs_d[:, None])
            v = tl.load(v_base + cols[:, None].to(tl.int64) * s_vs + offs_d[None, :])
        if INTERPRET:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
        if MASKED:
            s = tl.where(_tile_mask(rules, r0, r1, offs_m, cols), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # A row that has seen no key yet keeps m = -inf: use 0 so -inf − -inf never happens.
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))   # finite: every pair of the tile is attended
            m_use = m_new
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        return acc, m_new, l_i

    @triton.jit
    def _fwd_kernel(Q, K, V, O, LSE,
                    s_qb, s_qs, s_qh, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh, s_ob, s_os, s_oh,
                    q_order, full_ptr, full_kb, part_ptr, part_kb, part_tile, rule_ptr, rules,
                    seqlen_q, seqlen_k, heads_q, group, qk_scale,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    INTERPRET: tl.constexpr, PRECISION: tl.constexpr):
        qb = tl.load(q_order + tl.program_id(0))
        bh = tl.program_id(1)
        b = bh // heads_q
        h = bh % heads_q
        hk = h // group                                    # GQA: the KV head of this query head
        offs_m = qb * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        row_ok = offs_m < seqlen_q
        q = tl.load(Q + b.to(tl.int64) * s_qb + h * s_qh + offs_m[:, None].to(tl.int64) * s_qs
                    + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        if INTERPRET:
            q = q.to(tl.float32)
        k_base = K + b.to(tl.int64) * s_kb + hk * s_kh
        v_base = V + b.to(tl.int64) * s_vb + hk * s_vh
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        f_lo = tl.load(full_ptr + qb)
        f_hi = tl.load(full_ptr + qb + 1)
        p_lo = tl.load(part_ptr + qb)
        p_hi = tl.load(part_ptr + qb + 1)
        if INTERPRET:
            i = f_lo
            while i < f_hi:
                acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, k_base, v_base, tl.load(full_kb + i),
                                          offs_m, rules, 0, 0, s_ks, s_vs, seqlen_k, qk_scale,
                                          HEAD_DIM, BLOCK_N, False, INTERPRET, PRECISION)
                i += 1
            i = p_lo
            while i < p_hi:
                t = tl.load(part_tile + i)
                acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, k_base, v_base, tl.load(part_kb + i),
                                          offs_m, rules, tl.load(rule_ptr + t),
                                          tl.load(rule_ptr + t + 1), s_ks, s_vs, seqlen_k,
                                          qk_scale, HEAD_DIM, BLOCK_N, True, INTERPRET, PRECISION)
                i += 1
        else:
            for i in range(f_lo, f_hi):
                acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, k_base, v_base, tl.load(full_kb + i),
                                          offs_m, rules, 0, 0, s_ks, s_vs, seqlen_k, qk_scale,
                                          HEAD_DIM, BLOCK_N, False, INTERPRET, PRECISION)
            for i in range(p_lo, p_hi):
                t = tl.load(part_tile + i)
                acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, k_base, v_base, tl.load(part_kb + i),
                                          offs_m, rules, tl.load(rule_ptr + t),
                                          tl.load(rule_ptr + t + 1), s_ks, s_vs, seqlen_k,
                                          qk_scale, HEAD_DIM, BLOCK_N, True, INTERPRET, PRECISION)
        empty = l_i == 0.0
        out = acc / tl.where(empty, 1.0, l_i)[:, None]
        # log2-domain LSE; +inf for rows with no key, so the backward's exp2(s − lse) is 0 there.
        lse = tl.where(empty, float("inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        tl.store(O + b.to(tl.int64) * s_ob + h * s_oh + offs_m[:, None].to(tl.int64) * s_os
                 + offs_d[None, :], out.to(O.dtype.element_ty), mask=row_ok[:, None])
        tl.store(LSE + bh.to(tl.int64) * seqlen_q + offs_m, lse, mask=row_ok)

    @triton.jit
    def _dkdv_tile(dk, dv, k, v, q_base, do_base, LSE, DELTA, stat_base, qb, offs_n, rules,
                   r0, r1, s_qs, s_dos, seqlen_q, qk_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr,
                   INTERPRET: tl.constexpr, PRECISION: tl.constexpr):
        """One query tile's contribution to dK/dV, in the transposed [BLOCK_N, BLOCK_M] frame."""
        offs_d = tl.arange(0, HEAD_DIM)
        rows = qb * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < seqlen_q
        qt = tl.load(q_base + rows[None, :].to(tl.int64) * s_qs + offs_d[:, None],
                     mask=row_ok[None, :], other=0.0)
        do = tl.load(do_base + rows[:, None].to(tl.int64) * s_dos + offs_d[None, :],
                     mask=row_ok[:, None], other=0.0)
        if INTERPRET:
            qt = qt.to(tl.float32)
            do = do.to(tl.float32)
        # Rows past seqlen_q (and rows with no key) read lse = +inf: their probabilities are 0.
        lse = tl.load(LSE + stat_base + rows, mask=row_ok, other=float("inf"))
        delta = tl.load(DELTA + stat_base + rows, mask=row_ok, other=0.0)
        st = tl.dot(k, qt, input_precision=PRECISION) * qk_scale
        pt = tl.exp2(st - lse[None, :])
        if MASKED:
            pt = tl.where(_tile_mask_t(rules, r0, r1, rows, offs_n), pt, 0.0)
        dv += tl.dot(pt.to(do.dtype), do, input_precision=PRECISION)
        dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        dst = pt * (dpt - delta[None, :])
        dk += tl.dot(dst.to(qt.dtype), tl.trans(qt), input_precision=PRECISION)
        return dk, dv

    @triton.jit
    def _bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV,
                         s_qb, s_qs, s_qh, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh,
                         s_dob, s_dos, s_doh, s_dkb, s_dks, s_dkh, s_dvb, s_dvs, s_dvh,
                         k_order, full_ptr, full_qb, part_ptr, part_qb, part_tile, rule_ptr, rules,
                         seqlen_q, seqlen_k, heads_q, heads_kv, qk_scale, sm_scale,
                         GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         INTERPRET: tl.constexpr, PRECISION: tl.constexpr):
        kb = tl.load(k_order + tl.program_id(0))
        bhk = tl.program_id(1)
        b = bhk // heads_kv
        hk = bhk % heads_kv
        offs_n = kb * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        col_ok = offs_n < seqlen_k
        k = tl.load(K + b.to(tl.int64) * s_kb + hk * s_kh + offs_n[:, None].to(tl.int64) * s_ks
                    + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        v = tl.load(V + b.to(tl.int64) * s_vb + hk * s_vh + offs_n[:, None].to(tl.int64) * s_vs
                    + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        if INTERPRET:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        f_lo = tl.load(full_ptr + kb)
        f_hi = tl.load(full_ptr + kb + 1)
        p_lo = tl.load(part_ptr + kb)
        p_hi = tl.load(part_ptr + kb + 1)
        # GQA: this KV head's gradient sums over the query heads of its group, in-program
        # (no atomics, no expanded KV).
        for g in range(0, GROUP):
            h = hk * GROUP + g
            q_base = Q + b.to(tl.int64) * s_qb + h * s_qh
            do_base = DO + b.to(tl.int64) * s_dob + h * s_doh
            stat_base = (b * heads_q + h).to(tl.int64) * seqlen_q
            if INTERPRET:
                i = f_lo
                while i < f_hi:
                    dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, LSE, DELTA, stat_base,
                                        tl.load(full_qb + i), offs_n, rules, 0, 0, s_qs, s_dos,
                                        seqlen_q, qk_scale, HEAD_DIM, BLOCK_M, False, INTERPRET,
                                        PRECISION)
                    i += 1
                i = p_lo
                while i < p_hi:
                    t = tl.load(part_tile + i)
                    dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, LSE, DELTA, stat_base,
                                        tl.load(part_qb + i), offs_n, rules, tl.load(rule_ptr + t),
                                        tl.load(rule_ptr + t + 1), s_qs, s_dos, seqlen_q,
                                        qk_scale, HEAD_DIM, BLOCK_M, True, INTERPRET, PRECISION)
                    i += 1
            else:
                for i in range(f_lo, f_hi):
                    dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, LSE, DELTA, stat_base,
                                        tl.load(full_qb + i), offs_n, rules, 0, 0, s_qs, s_dos,
                                        seqlen_q, qk_scale, HEAD_DIM, BLOCK_M, False, INTERPRET,
                                        PRECISION)
                for i in range(p_lo, p_hi):
                    t = tl.load(part_tile + i)
                    dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, LSE, DELTA, stat_base,
                                        tl.load(part_qb + i), offs_n, rules, tl.load(rule_ptr + t),
                                        tl.load(rule_ptr + t + 1), s_qs, s_dos, seqlen_q,
                                        qk_scale, HEAD_DIM, BLOCK_M, True, INTERPRET, PRECISION)
        dk = dk * sm_scale
        tl.store(DK + b.to(tl.int64) * s_dkb + hk * s_dkh + offs_n[:, None].to(tl.int64) * s_dks
                 + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=col_ok[:, None])
        tl.store(DV + b.to(tl.int64) * s_dvb + hk * s_dvh + offs_n[:, None].to(tl.int64) * s_dvs
                 + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=col_ok[:, None])

    @triton.jit
    def _dq_tile(dq, q, do, lse, delta, k_base, v_base, kb, offs_m, rules, r0, r1, s_ks, s_vs,
                 seqlen_k, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                 MASKED: tl.constexpr, INTERPRET: tl.constexpr, PRECISION: tl.constexpr):
        """One key tile's contribution to dQ."""
        offs_d = tl.arange(0, HEAD_DIM)
        cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < seqlen_k
        k = tl.load(k_base + cols[:, None].to(tl.int64) * s_ks + offs_d[None, :],
                    mask=col_ok[:, None], other=0.0)
        vt = tl.load(v_base + cols[None, :].to(tl.int64) * s_vs + offs_d[:, None],
                     mask=col_ok[None, :], other=0.0)
        if INTERPRET:
            k = k.to(tl.float32)
            vt = vt.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        p = tl.exp2(s - lse[:, None])
        if MASKED:
            p = tl.where(_tile_mask(rules, r0, r1, offs_m, cols), p, 0.0)
        dp = tl.dot(do, vt, input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        return dq

    @triton.jit
    def _bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ,
                       s_qb, s_qs, s_qh, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh,
                       s_dob, s_dos, s_doh, s_dqb, s_dqs, s_dqh,
                       q_order, full_ptr, full_kb, part_ptr, part_kb, part_tile, rule_ptr, rules,
                       seqlen_q, seqlen_k, heads_q, group, qk_scale, sm_scale,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       INTERPRET: tl.constexpr, PRECISION: tl.constexpr):
        qb = tl.load(q_order + tl.program_id(0))
        bh = tl.program_id(1)
        b = bh // heads_q
        h = bh % heads_q
        hk = h // group
        offs_m = qb * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        row_ok = offs_m < seqlen_q
        q = tl.load(Q + b.to(tl.int64) * s_qb + h * s_qh + offs_m[:, None].to(tl.int64) * s_qs
                    + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        do = tl.load(DO + b.to(tl.int64) * s_dob + h * s_doh + offs_m[:, None].to(tl.int64) * s_dos
                     + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        if INTERPRET:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        lse = tl.load(LSE + bh.to(tl.int64) * seqlen_q + offs_m, mask=row_ok, other=float("inf"))
        delta = tl.load(DELTA + bh.to(tl.int64) * seqlen_q + offs_m, mask=row_ok, other=0.0)
        k_base = K + b.to(tl.int64) * s_kb + hk * s_kh
        v_base = V + b.to(tl.int64) * s_vb + hk * s_vh
        dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        f_lo = tl.load(full_ptr + qb)
        f_hi = tl.load(full_ptr + qb + 1)
        p_lo = tl.load(part_ptr + qb)
        p_hi = tl.load(part_ptr + qb + 1)
        if INTERPRET:
            i = f_lo
            while i < f_hi:
                dq = _dq_tile(dq, q, do, lse, delta, k_base, v_base, tl.load(full_kb + i), offs_m,
                              rules, 0, 0, s_ks, s_vs, seqlen_k, qk_scale, HEAD_DIM, BLOCK_N,
                              False, INTERPRET, PRECISION)
                i += 1
            i = p_lo
            while i < p_hi:
                t = tl.load(part_tile + i)
                dq = _dq_tile(dq, q, do, lse, delta, k_base, v_base, tl.load(part_kb + i), offs_m,
                              rules, tl.load(rule_ptr + t), tl.load(rule_ptr + t + 1), s_ks, s_vs,
                              seqlen_k, qk_scale, HEAD_DIM, BLOCK_N, True, INTERPRET, PRECISION)
                i += 1
        else:
            for i in range(f_lo, f_hi):
                dq = _dq_tile(dq, q, do, lse, delta, k_base, v_base, tl.load(full_kb + i), offs_m,
                              rules, 0, 0, s_ks, s_vs, seqlen_k, qk_scale, HEAD_DIM, BLOCK_N,
                              False, INTERPRET, PRECISION)
            for i in range(p_lo, p_hi):
                t = tl.load(part_tile + i)
                dq = _dq_tile(dq, q, do, lse, delta, k_base, v_base, tl.load(part_kb + i), offs_m,
                              rules, tl.load(rule_ptr + t), tl.load(rule_ptr + t + 1), s_ks, s_vs,
                              seqlen_k, qk_scale, HEAD_DIM, BLOCK_N, True, INTERPRET, PRECISION)
        dq = dq * sm_scale
        tl.store(DQ + b.to(tl.int64) * s_dqb + h * s_dqh + offs_m[:, None].to(tl.int64) * s_dqs
                 + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


_tile_mask = _tile_mask_t = _fwd_tile = _fwd_kernel = _dkdv_tile = _bwd_dkdv_kernel = None
_dq_tile = _bwd_dq_kernel = None

# ---------------------------------------------------------------------------------------------
# Launch configuration and the autograd function.
# ---------------------------------------------------------------------------------------------

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class Config:
    """Tile sizes and launch parameters (forward tiles; backward tiles for dK/dV and dQ)."""

    fwd_m: int = 128
    fwd_n: int = 64
    fwd_warps: int = 8
    fwd_stages: int = 3
    bwd_m: int = 64
    bwd_n: int = 64
    bwd_warps: int = 4
    bwd_stages: int = 2


def default_config(head_dim: int, device_type: str) -> Config:
    if device_type != "cuda":
        # Interpreter: one numpy op per tile, so larger tiles run faster.
        return Config(fwd_m=64, fwd_n=64, bwd_m=64, bwd_n=64)
    if head_dim > 128:
        return Config(fwd_m=64, fwd_n=32, fwd_warps=4, fwd_stages=2,
                      bwd_m=32, bwd_n=32, bwd_warps=4, bwd_stages=1)
    return Config()


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, fwd_meta, bwd_meta, cfg, fwd_layout, bwd_layout):
        _triton()
        b, sq, hq, d = q.shape
        sk, hkv = k.shape[1], k.shape[2]
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        o = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = torch.empty((b, hq, sq), device=q.device, dtype=torch.float32)
        sm_scale = 1.0 / math.sqrt(d)
        interp = interpret_mode()
        precision = "ieee" if q.dtype == torch.float32 else None  # fp32: no TF32 rounding
        grid = (fwd_layout.n_qb, b * hq)
        _fwd_kernel[grid](
            q, k, v, o, lse,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
            fwd_meta["q_order"], fwd_meta["q_full_ptr"], fwd_meta["q_full_kb"],
            fwd_meta["q_part_ptr"], fwd_meta["q_part_kb"], fwd_meta["q_part_tile"],
            fwd_meta["rule_ptr"], fwd_meta["rules"],
            sq, sk, hq, hq // hkv, sm_scale * LOG2E,
            HEAD_DIM=d, BLOCK_M=fwd_layout.block_m, BLOCK_N=fwd_layout.block_n,
            INTERPRET=interp, PRECISION=precision,
            num_warps=cfg.fwd_warps, num_stages=cfg.fwd_stages)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.bwd = (bwd_meta, cfg, bwd_layout)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        meta, cfg, layout = ctx.bwd
        b, sq, hq, d = q.shape
        sk, hkv = k.shape[1], k.shape[2]
        do = do if do.stride(-1) == 1 else do.contiguous()
        # delta_i = Σ_d dO·O: the row term of softmax's Jacobian (fp32, (b, h, s) like lse).
        delta = (do.float() * o.float()).sum(-1).transpose(1, 2).contiguous()
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        dk = torch.empty_like(k, memory_format=torch.contiguous_format)
        dv = torch.empty_like(v, memory_format=torch.contiguous_format)
        sm_scale = 1.0 / math.sqrt(d)
        interp = interpret_mode()
        precision = "ieee" if q.dtype == torch.float32 else None  # fp32: no TF32 rounding
        common = dict(HEAD_DIM=d, BLOCK_M=layout.block_m, BLOCK_N=layout.block_n, INTERPRET=interp,
                      PRECISION=precision, num_warps=cfg.bwd_warps, num_stages=cfg.bwd_stages)
        strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                   v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2))
        _bwd_dkdv_kernel[(layout.n_kb, b * hkv)](
            q, k, v, do, lse, delta, dk, dv, *strides,
            dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
            meta["k_order"], meta["k_full_ptr"], meta["k_full_qb"], meta["k_part_ptr"],
            meta["k_part_qb"], meta["k_part_tile"], meta["rule_ptr"], meta["rules"],
            sq, sk, hq, hkv, sm_scale * LOG2E, sm_scale, GROUP=hq // hkv, **common)
        _bwd_dq_kernel[(layout.n_qb, b * hq)](
            q, k, v, do, lse, delta, dq, *strides,
            dq.stride(0), dq.stride(1), dq.stride(2),
            meta["q_order"], meta["q_full_ptr"], meta["q_full_kb"], meta["q_part_ptr"],
            meta["q_part_kb"], meta["q_part_tile"], meta["rule_ptr"], meta["rules"],
            sq, sk, hq, hq // hkv, sm_scale * LOG2E, sm_scale, **common)
        return dq, dk, dv, None, None, None, None, None


@dataclass
class Prepared:
    """Everything ``attention`` needs, built once per (mask, config, device)."""

    cfg: Config
    fwd_layout: TileLayout
    bwd_layout: TileLayout
    fwd_meta: dict[str, torch.Tensor]
    bwd_meta: dict[str, torch.Tensor]


def prepare(mask: AttnMask, device: torch.device | str, head_dim: int,
            cfg: Config | None = None) -> Prepared:
    device = torch.device(device)
    cfg = cfg or default_config(head_dim, device.type)
    fwd = build_layout(mask, cfg.fwd_m, cfg.fwd_n)
    bwd = fwd if (cfg.bwd_m, cfg.bwd_n) == (cfg.fwd_m, cfg.fwd_n) else build_layout(
        mask, cfg.bwd_m, cfg.bwd_n)
    fwd_meta = fwd.to(device)
    bwd_meta = fwd_meta if bwd is fwd else bwd.to(device)
    return Prepared(cfg, fwd, bwd, fwd_meta, bwd_meta)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: Prepared) -> torch.Tensor:
    """Block-sparse attention of ``(batch, seqlen, heads, head_dim)`` tensors (autograd-capable)."""
    p = prepared
    if (q.shape[1], k.shape[1]) != (p.fwd_layout.seqlen_q, p.fwd_layout.seqlen_k):
        raise ValueError(f"layout is for {p.fwd_layout.seqlen_q}x{p.fwd_layout.seqlen_k}, "
                         f"tensors are {q.shape[1]}x{k.shape[1]}")
    return _Attention.apply(q, k, v, p.fwd_meta, p.bwd_meta, p.cfg, p.fwd_layout, p.bwd_layout)


# ---------------------------------------------------------------------------------------------
# The adapter.
# ---------------------------------------------------------------------------------------------

class TritonBlockSparse(Kernel):
    name = "triton_block_sparse"
    libraries = ("triton",)
    description = ("LongCA's own Triton block-sparse flash attention: full / partial / skipped "
                   "tiles from the mask's slices, in-kernel GQA, Triton backward")
    devices = ("cuda", "cpu")
    dtypes = (torch.bfloat16, torch.float16, torch.float32)
    supports_backward = True
    min_warmup = 1  # Triton compiles on the first call of each specialisation
    # Tile sizes and launch parameters (config ``kernel_options``); None = default_config's choice
    # for the head_dim and device.
    options = {f.name: None for f in dataclasses.fields(Config)}

    def config(self, problem: Problem) -> Config:
        chosen = {k: v for k, v in self.options.items() if v is not None}
        return dataclasses.replace(default_config(problem.head_dim, problem.device.type), **chosen)

    def available(self) -> str | None:
        # find_spec, not import: importing triton fixes, process-wide, whether its library is
        # interpreted (TRITON_INTERPRET), so only running the kernel imports it.
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed (pip install 'longca[triton]')"
        if not torch.cuda.is_available() and not interpret_mode():
            return "triton_block_sparse needs a CUDA GPU (or TRITON_INTERPRET=1 for Triton's CPU interpreter)"
        return None

    def supports_mask(self, problem: Problem) -> str | None:
        if problem.device.type == "cpu" and not interpret_mode():
            return "triton_block_sparse runs on CPU only under TRITON_INTERPRET=1 (Triton's interpreter)"
        if problem.device.type == "cuda" and interpret_mode():
            return "TRITON_INTERPRET=1 is set: Triton kernels would run in the CPU interpreter"
        if problem.head_dim not in HEAD_DIMS:
            return f"triton_block_sparse takes head_dim in {HEAD_DIMS}, not {problem.head_dim}"
        if max(problem.mask.seqlen_q, problem.mask.seqlen_k) >= _MAX_SEQLEN:
            return "sequence longer than the kernel's int32 positions"
        cfg = self.config(problem)
        for name in ("fwd_m", "fwd_n", "bwd_m", "bwd_n"):
            value = getattr(cfg, name)
            if value < 16 or value & (value - 1):
                return f"triton_block_sparse option {name}={value} is not a power of two >= 16"
        return None

    def prepare(self, problem: Problem) -> dict[str, Any]:
        prepared = prepare(problem.mask, problem.device, problem.head_dim, self.config(problem))
        return {"state": prepared}

    def forward(self, q, k, v, prepared):
        return attention(q, k, v, prepared["state"])

    def notes(self, prepared: dict[str, Any]) -> dict[str, Any]:
        p: Prepared = prepared["state"]
        out: dict[str, Any] = {"tile_m": p.fwd_layout.block_m, "tile_n": p.fwd_layout.block_n,
                               "mask_via": "tile lists + per-tile slice rules",
                               "interpret": interpret_mode()}
        out.update(p.fwd_layout.stats())
        if p.bwd_layout is not p.fwd_layout:
            out["bwd_tile_m"], out["bwd_tile_n"] = p.bwd_layout.block_m, p.bwd_layout.block_n
            out.update({f"bwd_{k}": v for k, v in p.bwd_layout.stats().items()})
        return out


register(TritonBlockSparse())
