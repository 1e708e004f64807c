"""The FFA adapter (longca/kernels/magi_ffa.py) on the CPU: each mask's slices become FFA's
(query range, key range, type) triples exactly, checked against FFA's documented rule for each type;
the adapter's call, through a stand-in library that follows those rules, is exact attention; and
without the library the cell is `unsupported`, saying so."""


import pytest
import torch
from stand_in import assert_matches_reference, fresh_adapter, install_library

from longca.attention import mask_convert, masks
from longca.attention.problem import Problem, ProblemSpec
from longca.execution.measure.cell import CellSpec, run_cell
from longca.execution.measure.gate import gate_problem
from longca.kernels.magi_ffa import ffa_ranges


def ffa_dense(q_ranges, k_ranges, attn_types, seqlen_q, seqlen_k) -> torch.Tensor:
    """What FFA attends, per flex_flash_attn_func's docstring: in a range pair with local query i of
    lq and key j of lk, full: all; causal (bottom-right): j <= i + lk - lq; inverse causal
    (top-left): j >= i; bi-causal: both."""
    out = torch.zeros(seqlen_q, seqlen_k, dtype=torch.bool)
    for (q0, q1), (k0, k1), t in zip(q_ranges, k_ranges, attn_types):
        i = torch.arange(q1 - q0)[:, None]
        j = torch.arange(k1 - k0)[None, :]
        below = j <= i + (k1 - k0) - (q1 - q0)
        above = j >= i
        rule = {0: torch.ones_like(below), 1: below, 2: above, 3: below & above}[t]
        assert not (out[q0:q1, k0:k1] & rule).any(), "two ranges attend one pair"
        out[q0:q1, k0:k1] |= rule
    return out


def _gate_mask(pattern: str, seqlen: int = 8192, target: int = 512):
    """The pattern at ``target`` tokens with its structure kept (windows, documents, blocks), as the
    correctness gate builds it."""
    problem = Problem.from_spec(ProblemSpec(mask=pattern, seqlen=seqlen, dtype="float32", seed=1))
    return gate_problem(problem, target).mask


@pytest.mark.parametrize("pattern", sorted(masks.PATTERNS))
def test_every_pattern_passes_to_ffa_one_to_one(pattern):
    mask = _gate_mask(pattern)
    q_ranges, k_ranges, attn_types = ffa_ranges(mask)
    assert set(attn_types) <= {0, 1, 2, 3}
    assert torch.equal(ffa_dense(q_ranges, k_ranges, attn_types, mask.seqlen_q, mask.seqlen_k),
                       mask_convert.dense(mask))


def test_a_batch_repeats_the_ranges_at_each_sequence():
    mask = _gate_mask("varlen_causal")
    one, two = ffa_ranges(mask), ffa_ranges(mask, batch=2)
    n = mask.seqlen_q
    assert two[0] == one[0] + [[a + n, b + n] for a, b in one[0]]
    assert two[2] == one[2] * 2
    dense = ffa_dense(*two, 2 * n, 2 * n)
    assert torch.equal(dense[:n, :n], mask_convert.dense(mask)) and torch.equal(dense[n:, n:], dense[:n, :n])
    assert not dense[:n, n:].any() and not dense[n:, :n].any()


def _stand_in_ffa(q, k, v, q_ranges, k_ranges, attn_type_map, **_):
    """A library following FFA's documented semantics, in plain torch: (tokens, heads, d), GQA."""
    allowed = ffa_dense(q_ranges.tolist(), k_ranges.tolist(), attn_type_map.tolist(), q.shape[0], k.shape[0])
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / q.shape[-1] ** 0.5
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", probs, v), None


@pytest.fixture
def ffa_library(monkeypatch):
    install_library(monkeypatch, "magi_attention.functional", flex_flash_attn_func=_stand_in_ffa)
    return fresh_adapter("ffa")


@pytest.mark.parametrize("pattern", ["sliding_window_causal", "varlen_block_causal", "prefix_lm_varlen",
                                     "shared_question"])
def test_the_adapter_calls_ffa_with_packed_tokens_and_gets_exact_attention(ffa_library, pattern):
    mask = _gate_mask(pattern, target=256)
    problem = Problem.from_spec(ProblemSpec(mask=pattern, seqlen=8192, dtype="float64", seed=1, batch=2,
                                            heads_q=4, heads_kv=2, head_dim=8))
    problem = gate_problem(problem, 256)
    assert problem.mask.slices == mask.slices
    q, k, v, grad_out = problem.make_inputs(requires_grad=True)
    out = ffa_library.forward(q, k, v, ffa_library.prepare(problem))
    assert_matches_reference(out, q, k, v, grad_out, problem.mask)


def test_without_the_library_a_cell_is_unsupported_and_says_what_to_install():
    row = run_cell(CellSpec(kernel="ffa", mask="causal", seqlen=128, dtype="bfloat16"))
    assert row["status"] == "unsupported"
    assert "is not importable" in row["reason"] and "MagiAttention" in row["reason"]


def test_ffa_block_sparse_runs_each_kv_heads_tiles_as_its_own_stretch_of_tokens(monkeypatch, ffa_library):
    """Per-head block patterns through the stand-in library: each KV head's kept tiles, offset by
    head and sequence, with the group's query heads as FFA's heads, are exact per-head attention
    (forward and gradients), against the reference masking each query head with its KV head's tiles."""
    kernel = fresh_adapter("ffa_block_sparse")
    problem = Problem.from_spec(ProblemSpec(mask="sparse", pattern="block_sparse_heads", seqlen=256, dtype="float64", seed=3,
                                            batch=2, heads_q=4, heads_kv=2, head_dim=8,
                                            mask_params={"kept": 0.3, "block": 32, "heads": 2, "group": 2}))
    prepared = kernel.prepare(problem)
    assert prepared["ranges"] == 2 * len(problem.mask.runs()[0])
    q, k, v, grad_out = problem.make_inputs(requires_grad=True)
    out = kernel.forward(q, k, v, prepared)
    assert_matches_reference(out, q, k, v, grad_out, problem.mask)
    # The pattern really differs per head, so a kernel applying one head's tiles to all would fail.
    tables = problem.mask.kept_blocks
    assert not (tables[0] == tables[1]).all()


def test_ffa_block_sparse_takes_only_per_head_patterns(ffa_library):
    kernel = fresh_adapter("ffa_block_sparse")
    problem = Problem.from_spec(ProblemSpec(mask="causal", seqlen=128, dtype="bfloat16"))
    assert "block_sparse_heads" in kernel.supports_mask(problem)
