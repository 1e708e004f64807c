"""The TransformerEngine adapter (longca/kernels/transformer_engine_attn.py) on the CPU, through a
stand-in `transformer_engine.pytorch` that follows DotProductAttention's documented semantics:
each mask it takes (full, causal, both windows, packed documents) goes in as TE's mask type and
window_size and gives exact attention; masks beyond documents × (causal | window) are unsupported."""


import pytest
import torch
from stand_in import install_library

from longca import kernels
from longca.attention import reference
from longca.attention.problem import Problem, ProblemSpec
from longca.execution.measure.gate import gate_problem
from longca.kernels import transformer_engine_attn


class StandInDotProductAttention:
    """DotProductAttention as documented: key j is attended by query i of the same sequence (bshd) or
    document (thd, cu_seqlens) when j in [i - left, i + right] of window_size, (-1, -1) meaning no
    window; a mask type with "causal" adds j <= i.  Output heads are flattened into the hidden size."""

    made: list[dict] = []

    def __init__(self, heads, head_dim, *, num_gqa_groups, attention_dropout, qkv_format, attn_mask_type,
                 window_size=None):
        self.qkv_format, self.attn_mask_type = qkv_format, attn_mask_type
        causal = "causal" in attn_mask_type
        if window_size is None:
            window_size = (-1, 0) if causal else (-1, -1)
        assert not causal or window_size[1] == 0, "TE: a causal mask type takes (left, 0)"
        self.window_size = window_size
        StandInDotProductAttention.made.append({"qkv_format": qkv_format, "attn_mask_type": attn_mask_type,
                                                "window_size": window_size})

    def _allowed(self, n):
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        left, right = self.window_size
        ok = torch.ones(n, n, dtype=torch.bool)
        if left >= 0:
            ok &= j >= i - left
        if right >= 0:
            ok &= j <= i + right
        if "causal" in self.attn_mask_type:
            ok &= j <= i
        return ok

    def _attend(self, q, k, v):  # (tokens, heads, d), GQA
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / q.shape[-1] ** 0.5
        probs = torch.softmax(scores.masked_fill(~self._allowed(q.shape[0]), float("-inf")), dim=-1)
        return torch.einsum("hqk,khd->qhd", probs, v)

    def __call__(self, q, k, v, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None):
        if self.qkv_format == "thd":
            assert cu_seqlens_q is not None and torch.equal(cu_seqlens_q, cu_seqlens_kv)
            cu = cu_seqlens_q.tolist()
            assert max_seqlen_q == max(b - a for a, b in zip(cu, cu[1:]))
            out = torch.cat([self._attend(q[a:b], k[a:b], v[a:b]) for a, b in zip(cu, cu[1:])])
            return out.flatten(1)
        assert self.qkv_format == "bshd" and cu_seqlens_q is None
        return torch.stack([self._attend(*x) for x in zip(q, k, v)]).flatten(2)


@pytest.fixture
def te_adapter(monkeypatch):
    install_library(monkeypatch, "transformer_engine.pytorch", DotProductAttention=StandInDotProductAttention,
                    __version__="stand-in")
    transformer_engine_attn._te.cache_clear()
    StandInDotProductAttention.made.clear()
    yield kernels.get("te_fused")
    transformer_engine_attn._te.cache_clear()


@pytest.mark.parametrize(("pattern", "mask_type", "window"), [
    ("full", "no_mask", None), ("causal", "causal", None),
    ("sliding_window", "no_mask", "w,w"), ("sliding_window_causal", "causal", "w,0"),
    ("varlen_full", "padding", None), ("varlen_causal_long", "padding_causal", None)])
def test_each_mask_goes_in_as_te_mask_type_and_window_and_is_exact(te_adapter, pattern, mask_type, window):
    problem = Problem.from_spec(ProblemSpec(mask=pattern, seqlen=8192, dtype="float64", seed=1, batch=2,
                                            heads_q=4, heads_kv=2, head_dim=8))
    problem = gate_problem(problem, 256)     # the pattern's structure at 256 tokens, as the gate runs it
    assert te_adapter.supports_mask(problem) is None
    prepared = te_adapter.prepare(problem)
    made = StandInDotProductAttention.made[-1]
    assert made["attn_mask_type"] == mask_type
    if window is None:
        assert "window" not in prepared
    else:
        w = int(problem.mask.params["window"])
        expected = (w, w if window == "w,w" else 0)
        assert made["window_size"] == expected and te_adapter.notes(prepared)["window"] == list(expected)
    q, k, v, _ = problem.make_inputs(requires_grad=False)
    assert torch.allclose(te_adapter.forward(q, k, v, prepared), reference.attention(q, k, v, problem.mask),
                          atol=1e-10)


@pytest.mark.parametrize("pattern", ["shared_question", "causal_blockwise", "prefix_lm_causal", "global_sliding_window"])
def test_masks_beyond_documents_and_windows_are_unsupported_with_the_reason(te_adapter, pattern):
    problem = Problem.from_spec(ProblemSpec(mask=pattern, seqlen=512, dtype="float64", seed=1))
    reason = te_adapter.supports_mask(problem)
    assert reason and "sliding windows and packed documents" in reason and repr(pattern) in reason
