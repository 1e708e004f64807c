"""A CP block as varlen calls (``longca.cp.fused_varlen``): the calls it plans and the bookkeeping
around them, on the CPU with a plain varlen kernel (``tests/varlen_reference.py``) in place of
FlashAttention-3.  Every mask, restricted to random query × key spans, must give the exact block
output, LSE and gradients."""

import random

import pytest
import torch

from longca.attention import reference
from longca.attention.masks import AttnMask, AttnSlice
from longca.cp.blocks import Span, merge_slices, restrict
from longca.cp.fused_varlen import VarlenBlockOps, layers, plan_calls, trimmed

from test_cp_blocks import PATTERNS, _mask, _random_spans
from varlen_reference import ReferenceVarlen


def _attend(ops, slices, q, k, v, do):
    """The block through ``ops``: (out, lse (b, h, s)) and (dq, dk, dv) from its own statistics."""
    prepared = ops.prepare(slices, q.device)
    acc = ops.new_accumulators(q)
    ops.forward_into(q, k, v, prepared, q.shape[-1] ** -0.5, acc)
    out, lse = acc.result()
    lse = lse.transpose(1, 2)
    lse_bwd = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)
    dq = ops.new_dq(q)
    dk, dv = ops.backward_into(do, q, k, v, out.to(q.dtype), lse_bwd, prepared, q.shape[-1] ** -0.5, dq)
    return out, lse, (ops.dq_result(dq, q.dtype), dk, dv)


def _exact(slices, q, k, v, do):
    mask = AttnMask("block", q.shape[1], k.shape[1], tuple(slices))
    ref, ref_lse = reference.attention(q, k, v, mask, return_lse=True)
    qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
    grads = torch.autograd.grad(reference.attention(qr, kr, vr, mask), (qr, kr, vr), do)
    return ref, ref_lse, grads


@pytest.mark.parametrize("name", PATTERNS)
def test_any_block_of_any_mask_is_exact(name):
    rng = random.Random(name)
    for seed in range(2):
        seqlen = rng.choice([96, 130])
        mask = _mask(name, seqlen, seed)
        for trial in range(4):
            qs, lq = _random_spans(seqlen, rng)
            ks, lk = _random_spans(seqlen, rng)
            slices = restrict(mask, qs, ks)
            batch = 1 + trial % 2
            torch.manual_seed(trial)
            q, do = (torch.randn(batch, lq, 4, 8, dtype=torch.float64) for _ in range(2))
            k, v = (torch.randn(batch, lk, 2, 8, dtype=torch.float64) for _ in range(2))
            out, lse, grads = _attend(VarlenBlockOps(ReferenceVarlen()), slices, q, k, v, do)
            ref, ref_lse, ref_grads = _exact(slices, q, k, v, do)
            assert torch.allclose(out.double(), ref, atol=1e-5), (name, qs, ks)
            assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
            seen = torch.isfinite(ref_lse)
            assert torch.allclose(lse[seen].double(), ref_lse[seen], atol=1e-5)
            for got, want in zip(grads, ref_grads):
                assert torch.allclose(got.double(), want, atol=1e-5), (name, qs, ks)


def test_blocks_merge_into_one_accumulator_whatever_comes_first():
    """A shard attends two key blocks; folding them in either order gives attention over both."""
    mask = _mask("varlen_causal", 120, 1)
    q_spans = (Span(60, 120, 0),)
    halves = ((Span(0, 60, 0),), (Span(60, 120, 0),))
    torch.manual_seed(0)
    q = torch.randn(1, 60, 2, 8, dtype=torch.float64)
    k, v = torch.randn(1, 120, 2, 8, dtype=torch.float64), torch.randn(1, 120, 2, 8, dtype=torch.float64)
    want = reference.attention(q, k, v, restrict_mask(mask, q_spans))
    for order in (halves, halves[::-1]):
        ops = VarlenBlockOps(ReferenceVarlen())
        acc = ops.new_accumulators(q)
        for spans in order:
            part = slice(spans[0].start, spans[0].end)
            prepared = ops.prepare(restrict(mask, q_spans, spans), q.device)
            ops.forward_into(q, k[:, part], v[:, part], prepared, 8 ** -0.5, acc)
        assert torch.allclose(acc.result()[0].double(), want, atol=1e-5)


def restrict_mask(mask, q_spans):
    whole = (Span(0, mask.seqlen_k, 0),)
    return AttnMask("rows", q_spans[0].end - q_spans[0].start, mask.seqlen_k, restrict(mask, q_spans, whole))


def test_a_document_mask_is_one_call_per_rule_and_viewed_not_gathered():
    """A rank's own block of whole documents, merged as ``prepare`` merges it: one causal call over
    the shard as it lies in memory; a block of earlier pieces adds one full call."""
    mask = _mask("varlen_causal", 200, 3)
    whole = (Span(0, 200, 0),)
    calls = plan_calls(merge_slices(restrict(mask, whole, whole)), 1, 200, 200, torch.device("cpu"))
    assert len(calls) == 1 and calls[0].causal and calls[0].q_view == slice(0, 200) and calls[0].k_view
    assert calls[0].rows == 200
    two = plan_calls([AttnSlice(0, 10, 0, 10, "causal"), AttnSlice(10, 30, 0, 40, "full"),
                      AttnSlice(10, 30, 40, 60, "causal")], 1, 30, 60, torch.device("cpu"))
    assert sorted(c.causal for c in two) == [False, True]


def test_layers_keep_query_rows_apart_and_rules_per_call():
    slices = [AttnSlice(0, 10, 0, 10, "full"), AttnSlice(5, 15, 20, 30, "full"),
              AttnSlice(0, 10, 30, 40, "bi_causal"), AttnSlice(0, 10, 40, 55, "bi_causal"),
              AttnSlice(10, 20, 0, 5, "bi_causal")]   # fewer keys than queries: a band with no area
    got = layers(slices)
    assert [(rule, [s.as_tuple()[:4] for s in layer]) for rule, layer in got] == [
        ((False, -1, -1), [(0, 10, 0, 10)]), ((False, -1, -1), [(5, 15, 20, 30)]),
        ((False, 0, 0), [(0, 10, 30, 40)]), ((False, 5, 0), [(0, 10, 40, 55)])]


def test_trimming_drops_the_rows_that_see_nothing():
    assert trimmed(AttnSlice(0, 10, 0, 4, "causal")) == AttnSlice(6, 10, 0, 4, "causal")
    assert trimmed(AttnSlice(0, 10, 0, 4, "inv_causal")) == AttnSlice(0, 4, 0, 4, "inv_causal")
    assert trimmed(AttnSlice(0, 10, 0, 4, "bi_causal")) is None
    assert trimmed(AttnSlice(0, 10, 0, 12, "bi_causal")) == AttnSlice(0, 10, 0, 12, "bi_causal")


def test_a_shard_wide_first_call_writes_output_and_dq_in_place_and_bf16_merges_stay_close():
    """The rank's own block of whole documents (one causal call over every row) writes the bf16
    output and dq the kernel makes, with no float32 copy; a second block (earlier pieces of a
    document held elsewhere) is merged in float32 and rounded once: bf16-close to the exact result."""
    mask = _mask("varlen_causal", 256, 2)
    mine, other = (Span(128, 256, 0),), (Span(0, 128, 0),)
    torch.manual_seed(1)
    q, do = (torch.randn(1, 128, 4, 16, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, 256, 2, 16, dtype=torch.bfloat16) for _ in range(2))
    fns = ReferenceVarlen()
    ops = VarlenBlockOps(fns)
    acc = ops.new_accumulators(q)
    own = ops.prepare(restrict(mask, mine, mine), q.device)
    earlier = ops.prepare(restrict(mask, mine, other), q.device)
    assert earlier["slices"]   # a document crosses the cut: the second block is not empty
    ops.forward_into(q, k[:, 128:], v[:, 128:], own, 0.25, acc)
    ops.forward_into(q, k[:, :128], v[:, :128], earlier, 0.25, acc)
    assert acc.out.dtype == torch.bfloat16 and fns.written_in_place[0] == ("out", True)
    rows = AttnMask("rows", 128, 256, restrict(mask, mine, (Span(0, 256, 0),)))
    want, want_lse = reference.attention(q.double(), k.double(), v.double(), rows, scale=0.25, return_lse=True)
    out, lse = acc.result()
    assert (out.double() - want).abs().max() < 2e-2
    assert torch.allclose(lse.transpose(1, 2).double(), want_lse, atol=1e-2)
    dq = ops.new_dq(q)
    lse_bwd = lse.transpose(1, 2).contiguous()
    ops.backward_into(do, q, k[:, 128:], v[:, 128:], out, lse_bwd, own, 0.25, dq)
    ops.backward_into(do, q, k[:, :128], v[:, :128], out, lse_bwd, earlier, 0.25, dq)
    assert ("dq", True) in fns.written_in_place
    qr, kr, vr = (t.double().requires_grad_(True) for t in (q, k, v))
    want_dq, = torch.autograd.grad(reference.attention(qr, kr, vr, rows, scale=0.25), (qr,), do.double())
    assert (ops.dq_result(dq, torch.bfloat16).double() - want_dq).abs().max() < 3e-2
