"""A plain varlen kernel for CPU tests of ``longca.cp.fused_varlen``: what FlashAttention-3's varlen
forward and backward compute, sequence by sequence, in float64 matmuls."""

import torch

from longca.cp.fused_varlen import VarlenFns


def _allowed(call, lq: int, lk: int) -> torch.Tensor:
    # Bottom-right aligned: row i's diagonal is key i + lk - lq; -1 leaves a side unbounded.
    left, right = call.window
    if call.causal:
        right = 0
    i = torch.arange(lq).unsqueeze(1) + (lk - lq)
    j = torch.arange(lk).unsqueeze(0)
    ok = torch.ones(lq, lk, dtype=torch.bool)
    if right >= 0:
        ok &= j <= i + right
    if left >= 0:
        ok &= j >= i - left
    return ok


def _sequences(call):
    cu_q, cu_k = call.cu_q.tolist(), call.cu_k.tolist()
    return [(cu_q[n], cu_q[n + 1], cu_k[n], cu_k[n + 1]) for n in range(len(cu_q) - 1)]


def _expand(x, group):
    return x.repeat_interleave(group, dim=1)


class ReferenceVarlen(VarlenFns):
    def __init__(self):
        self.calls = 0
        self.written_in_place = []   # per call: whether the caller gave the output (dq) buffer

    def forward(self, q, k, v, call, scale, sm_margin, out=None):
        self.calls += 1
        self.written_in_place.append(("out", out is not None))
        group = q.shape[1] // k.shape[1]
        if out is None:
            out = torch.empty_like(q)
        out.zero_()
        lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32)
        for a, b, c, d in _sequences(call):
            qs, ks, vs = q[a:b].double(), _expand(k[c:d], group).double(), _expand(v[c:d], group).double()
            s = torch.einsum("qhd,khd->hqk", qs, ks) * scale
            s = s.masked_fill(~_allowed(call, b - a, d - c), float("-inf"))
            row_lse = torch.logsumexp(s, -1)
            out[a:b] = torch.einsum("hqk,khd->qhd", torch.exp(s - row_lse.unsqueeze(-1)), vs).to(q.dtype)
            lse[:, a:b] = row_lse.float()
        return out, lse

    def backward(self, dout, q, k, v, out, lse, call, scale, sm_margin, dq=None):
        self.written_in_place.append(("dq", dq is not None))
        group = q.shape[1] // k.shape[1]
        if dq is None:
            dq = torch.empty_like(q)
        dq.zero_()
        dk = torch.zeros(k.shape[0], q.shape[1], k.shape[2], dtype=torch.float64)
        dv = torch.zeros_like(dk)
        for a, b, c, d in _sequences(call):
            qs, ks, vs = q[a:b].double(), _expand(k[c:d], group).double(), _expand(v[c:d], group).double()
            do, o = dout[a:b].double(), out[a:b].double()
            s = torch.einsum("qhd,khd->hqk", qs, ks) * scale
            s = s.masked_fill(~_allowed(call, b - a, d - c), float("-inf"))
            p = torch.exp(s - lse[:, a:b].double().unsqueeze(-1))
            dv[c:d] += torch.einsum("hqk,qhd->khd", p, do)
            dp = torch.einsum("qhd,khd->hqk", do, vs)
            ds = p * (dp - (do * o).sum(-1).t().unsqueeze(-1))
            dq[a:b] = (torch.einsum("hqk,khd->qhd", ds, ks) * scale).to(q.dtype)
            dk[c:d] += torch.einsum("hqk,qhd->khd", ds, qs) * scale
        fold = lambda g: g.view(g.shape[0], k.shape[1], group, g.shape[2]).sum(2).to(k.dtype)
        return dq, fold(dk), fold(dv)
