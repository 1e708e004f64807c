"""Every pattern against an independent element-wise oracle written from its definition."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longca.attention.masks import (
    PATTERNS,
    AttnMask,
    AttnSlice,
    MaskError,
    SliceKind,
    build,
    check_disjoint,
    from_slices,
    pattern_params,
)

# ---------------------------------------------------------------------------------------------
# Oracles: (i, j) grids and per-token document ids, straight from the formulas in docs/masks.md.
# ---------------------------------------------------------------------------------------------


def _grid(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(n).unsqueeze(1), torch.arange(n).unsqueeze(0)


def _docs(m: AttnMask) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """doc id per token, position inside its document, and its document's length."""
    lengths = torch.tensor(m.documents)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    start = torch.cumsum(lengths, 0) - lengths
    pos = torch.arange(m.seqlen_q) - start[doc]
    return doc, pos, lengths[doc]


def _same_doc(m: AttnMask) -> torch.Tensor:
    doc, _, _ = _docs(m)
    return doc.unsqueeze(1) == doc.unsqueeze(0)


def o_full(m):
    return torch.ones(m.seqlen_q, m.seqlen_k, dtype=torch.bool)


def o_causal(m):
    i, j = _grid(m.seqlen_q)
    return j <= i


def o_sliding_window(m):
    i, j = _grid(m.seqlen_q)
    return (i - j).abs() <= m.params["window"]


def o_sliding_window_causal(m):
    i, j = _grid(m.seqlen_q)
    return (i - j >= 0) & (i - j <= m.params["window"])


def o_varlen_full(m):
    return _same_doc(m)


def o_varlen_causal(m):
    return _same_doc(m) & o_causal(m)


def o_shared_question(m):
    doc, _, _ = _docs(m)
    question_key = (doc.unsqueeze(0) == 0) & (doc.unsqueeze(1) > 0)
    return (_same_doc(m) & o_causal(m)) | question_key


def o_causal_blockwise(m):
    doc, _, _ = _docs(m)
    last = (doc == len(m.documents) - 1).unsqueeze(1)
    return (_same_doc(m) | last) & o_causal(m)


def o_prefix_lm_causal(m):
    i, j = _grid(m.seqlen_q)
    return j <= torch.clamp(i, min=m.params["prefix"] - 1)


def o_prefix_lm_varlen(m):
    _, pos, length = _docs(m)
    p_d = torch.clamp(length, max=m.params["prefix"])
    li, lj = pos.unsqueeze(1), pos.unsqueeze(0)
    return _same_doc(m) & (lj <= torch.maximum(li, (p_d - 1).unsqueeze(1)))


def o_global_sliding_window(m):
    i, j = _grid(m.seqlen_q)
    g, w = m.params["global_tokens"], m.params["window"]
    return (i < g) | (j < g) | ((i - j).abs() <= w)


def o_varlen_block_causal(m):
    _, pos, _ = _docs(m)
    b = m.params["block"]
    return _same_doc(m) & (pos.unsqueeze(0) // b <= pos.unsqueeze(1) // b)


ORACLES = {
    "full": o_full, "causal": o_causal,
    "sliding_window": o_sliding_window, "sliding_window_causal": o_sliding_window_causal,
    "varlen_full": o_varlen_full, "varlen_causal": o_varlen_causal,
    "varlen_full_long": o_varlen_full, "varlen_causal_long": o_varlen_causal,
    "shared_question": o_shared_question, "causal_blockwise": o_causal_blockwise,
    "prefix_lm_causal": o_prefix_lm_causal, "prefix_lm_varlen": o_prefix_lm_varlen,
    "global_sliding_window": o_global_sliding_window,
    "varlen_block_causal": o_varlen_block_causal,
}

# Small windows/blocks/prefixes so the structure is exercised at test sizes; small documents
# (a custom histogram) so document patterns have many documents at ≤ 1536 tokens.
SMALL_DOCS = {"edges": [1, 8, 64, 300], "weights": [0.3, 0.5, 0.2]}
SMALL = {
    "sliding_window": {"window": 37},
    "sliding_window_causal": {"window": 37},
    "global_sliding_window": {"window": 29, "global_tokens": 7},
    "varlen_block_causal": {"block": 16, "histogram": SMALL_DOCS},
    "prefix_lm_causal": {"prefix": 100},
    "prefix_lm_varlen": {"prefix": 20, "histogram": SMALL_DOCS},
    "varlen_full": {"histogram": SMALL_DOCS},
    "varlen_causal": {"histogram": SMALL_DOCS},
    "varlen_full_long": {"histogram": SMALL_DOCS, "long_min": 100, "long_max": 400},
    "varlen_causal_long": {"histogram": SMALL_DOCS, "long_min": 100, "long_max": 400},
    "shared_question": {"histogram": SMALL_DOCS},
    "causal_blockwise": {"histogram": SMALL_DOCS},
}

LENGTHS = [1, 2, 257, 1000, 1536]
SEEDS = [0, 1, 2]


def test_registry_has_the_14_patterns():
    assert set(PATTERNS) == set(ORACLES)
    assert len(PATTERNS) == 14


def _check(m: AttnMask, n: int) -> None:
    assert (m.seqlen_q, m.seqlen_k) == (n, n)
    dense = m.to_dense()
    expected = ORACLES[m.name](m)
    assert torch.equal(dense, expected), f"{m.name} n={n} params={m.params}"
    assert m.area() == int(dense.sum())
    assert m.density() == pytest.approx(int(dense.sum()) / n**2)
    # Non-overlap: no pair is covered by two slices.
    count = torch.zeros(n, n, dtype=torch.int16)
    for s in m.slices:
        assert 0 <= s.q_start < s.q_end <= n and 0 <= s.k_start < s.k_end <= n
        count[s.q_start:s.q_end, s.k_start:s.k_end] += s.dense().to(torch.int16)
    assert int(count.max()) <= 1
    check_disjoint(m.slices)  # the library's own exact check agrees
    if m.documents is not None:
        assert sum(m.documents) == n and min(m.documents) >= 1


@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("seed", SEEDS)
def test_pattern_matches_oracle_small_params(name, n, seed):
    _check(build(name, n, seed=seed, **SMALL.get(name, {})), n)


@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.parametrize("n", [300, 1200])
def test_pattern_matches_oracle_default_params(name, n):
    _check(build(name, n, seed=5), n)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_same_seed_same_mask(name):
    a = build(name, 1000, seed=4, **SMALL.get(name, {}))
    b = build(name, 1000, seed=4, **SMALL.get(name, {}))
    assert a == b


@pytest.mark.parametrize("name", sorted(n for n in PATTERNS if "documents" in pattern_params(n)))
def test_different_seeds_different_documents(name):
    docs = {build(name, 1500, seed=s, **SMALL.get(name, {})).documents for s in range(4)}
    assert len(docs) == 4


@pytest.mark.parametrize("name", sorted(n for n in PATTERNS if "documents" in pattern_params(n)))
def test_explicit_documents(name):
    m = build(name, 100, documents=[30, 1, 69])
    assert m.documents == (30, 1, 69)
    assert m.params["distribution"] == "explicit"
    _check(m, 100)


def test_prefix_default_is_seeded_and_recorded():
    a, b = build("prefix_lm_causal", 1000, seed=1), build("prefix_lm_causal", 1000, seed=2)
    assert 250 <= a.params["prefix"] < 750 and a.params["prefix"] != b.params["prefix"]
    m = build("prefix_lm_varlen", 4000, seed=1)
    assert m.params["prefix"] >= 1 and "prefix_fraction" in m.params


def test_prefix_does_not_change_documents():
    a = build("prefix_lm_varlen", 5000, seed=3)
    b = build("prefix_lm_varlen", 5000, seed=3, prefix=7)
    assert a.documents == b.documents


@pytest.mark.parametrize("name,param,value,limit", [
    ("sliding_window", "window", 1024, 511),
    ("sliding_window_causal", "window", 5000, 511),
    ("prefix_lm_causal", "prefix", 9999, 512),
    ("global_sliding_window", "global_tokens", 600, 512),
])
def test_clamping_is_recorded(name, param, value, limit):
    m = build(name, 512, **{param: value})
    assert m.params[param] == limit and m.params[f"{param}_requested"] == value
    _check(m, 512)


def test_clamped_window_equals_full_and_causal():
    assert torch.equal(build("sliding_window", 512).to_dense(), build("full", 512).to_dense())
    assert torch.equal(build("sliding_window_causal", 512).to_dense(),
                       build("causal", 512).to_dense())


def test_slice_counts_stay_small():
    # Cost proportional to documents / blocks, never to the area.
    assert len(build("sliding_window", 1 << 20).slices) == 3
    assert len(build("global_sliding_window", 1 << 20).slices) == 5
    m = build("varlen_block_causal", 1 << 17, block=1024)
    assert len(m.slices) <= (1 << 17) // 1024 + len(m.documents)


def test_area_matches_closed_form_at_scale():
    n = 1 << 20
    assert build("full", n).area() == n * n
    assert build("causal", n).area() == n * (n + 1) // 2
    w = 1024
    assert build("sliding_window_causal", n, window=w).area() == \
        (w + 1) * n - w * (w + 1) // 2
    m = build("varlen_causal", n, seed=1)
    assert m.area() == sum(d * (d + 1) // 2 for d in m.documents)


# ---------------------------------------------------------------------------------------------
# Bad input: MaskError naming the parameter.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call,match", [
    (lambda: build("nope", 10), "unknown mask pattern 'nope'"),
    (lambda: build("causal", 0), "seqlen"),
    (lambda: build("causal", 10.0), "seqlen"),
    (lambda: build("causal", 10, seed=-1), "seed"),
    (lambda: build("causal", 10, window=3), "unknown parameter.*window"),
    (lambda: build("varlen_full", 10, windwo=3), "unknown parameter.*windwo"),
    (lambda: build("sliding_window", 10, window=0), "window"),
    (lambda: build("sliding_window_causal", 10, window=-3), "window"),
    (lambda: build("global_sliding_window", 10, window=0), "window"),
    (lambda: build("global_sliding_window", 10, global_tokens=-1), "global_tokens"),
    (lambda: build("varlen_block_causal", 10, block=0), "block"),
    (lambda: build("prefix_lm_causal", 10, prefix=-1), "prefix"),
    (lambda: build("varlen_full", 10, documents=[3, 3]), "documents sum to 6"),
    (lambda: build("varlen_full", 10, documents=[5, 0, 5]), r"documents\[1\]"),
    (lambda: build("varlen_full", 10, documents=[]), "documents"),
    (lambda: build("varlen_full", 10, documents=[10], histogram=SMALL_DOCS), "histogram"),
    (lambda: build("varlen_full", 10, histogram={"edges": [1, 5], "weights": [0]}),
     "no weight"),
    (lambda: build("varlen_full_long", 10, long_fraction=2), "long_fraction"),
])
def test_bad_input(call, match):
    with pytest.raises(MaskError, match=match):
        call()


def test_mask_error_is_value_error():
    assert issubclass(MaskError, ValueError)


# ---------------------------------------------------------------------------------------------
# Custom masks from slice lists.
# ---------------------------------------------------------------------------------------------

def test_from_slices_basic():
    m = from_slices("mine", 8, 6, [[0, 4, 0, 4, "causal"], [4, 8, 0, 6, "FULL"]])
    assert m.area() == 10 + 24 == int(m.to_dense().sum())
    assert m.slices[1].kind is SliceKind.FULL


def test_from_slices_accepts_pair_disjoint_overlapping_rectangles():
    # Lower triangle (diagonal included) + strict upper triangle of the same square.
    m = from_slices("split", 5, 5, [[0, 5, 0, 5, "causal"], [0, 4, 1, 5, "inv_causal"]])
    assert torch.equal(m.to_dense(), torch.ones(5, 5, dtype=torch.bool))


@pytest.mark.parametrize("slices,match", [
    ([[0, 4, 0, 4, "causal"], [2, 6, 0, 2, "full"]], r"slices\[0\] and slices\[1\] overlap"),
    ([[0, 5, 0, 5, "causal"], [0, 5, 0, 5, "inv_causal"]], "overlap"),
    ([[0, 9, 0, 4, "full"]], r"slices\[0\].*query range"),
    ([[0, 4, 3, 3, "full"]], r"slices\[0\].*key range"),
    ([[0, 4, 0, 4, "full"], [4, 2, 0, 4, "full"]], r"slices\[1\].*query range"),
    ([[0, 4, -1, 4, "full"]], r"slices\[0\].*key range"),
    ([[0, 4, 0, 4, "diagonal"]], r"slices\[0\].*unknown kind 'diagonal'"),
    ([[0, 4, 0, 4]], r"slices\[0\]"),
    ([[0, 4, 0, 2, "bi_causal"]], r"slices\[0\].*attends no pair"),
    ([[0, 4.5, 0, 4, "full"]], r"slices\[0\].*q_end"),
    ([], "slices"),
])
def test_from_slices_errors(slices, match):
    with pytest.raises(MaskError, match=match):
        from_slices("bad", 8, 8, slices)


KINDS = [k.value for k in SliceKind]


@st.composite
def slice_lists(draw):
    sq = draw(st.integers(1, 24))
    sk = draw(st.integers(1, 24))
    items = []
    for _ in range(draw(st.integers(1, 5))):
        qs = draw(st.integers(0, sq - 1))
        qe = draw(st.integers(qs + 1, sq))
        ks = draw(st.integers(0, sk - 1))
        ke = draw(st.integers(ks + 1, sk))
        items.append([qs, qe, ks, ke, draw(st.sampled_from(KINDS))])
    return sq, sk, items


@settings(max_examples=300, deadline=None)
@given(slice_lists())
def test_from_slices_property(case):
    sq, sk, items = case
    count = torch.zeros(sq, sk, dtype=torch.int16)
    empty = False
    for it in items:
        s = AttnSlice(*it)
        empty |= s.area() == 0
        count[s.q_start:s.q_end, s.k_start:s.k_end] += s.dense().to(torch.int16)
    if empty:
        with pytest.raises(MaskError, match="attends no pair"):
            from_slices("h", sq, sk, items)
    elif int(count.max()) > 1:
        with pytest.raises(MaskError, match="overlap"):
            from_slices("h", sq, sk, items)
    else:
        m = from_slices("h", sq, sk, items)
        assert m.area() == int(count.sum()) == int(m.to_dense().sum())


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 30), st.integers(1, 30), st.sampled_from(KINDS))
def test_slice_area_closed_form(lq, lk, kind):
    s = AttnSlice(0, lq, 0, lk, kind)
    assert s.area() == int(s.dense().sum())


def test_masks_cli_lists_every_pattern_with_its_parameters_and_defaults():
    import subprocess
    import sys

    from longca.attention.masks import BLOCK, GLOBAL_TOKENS, SPARSE_BLOCK, WINDOW

    out = subprocess.run([sys.executable, "-m", "longca", "masks"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[1:] if line and not line[0].isspace()}
    assert list(rows) == [*PATTERNS, "custom", "block_sparse", "block_sparse_heads", "variable_block_sparse_heads"]
    for name in PATTERNS:
        assert all(p in rows[name] for p in pattern_params(name)), rows[name]
    assert rows["full"].split()[1:] == ["-"] and not any("seed" in row for row in rows.values())
    assert rows["sliding_window"].endswith(f" window={WINDOW}")
    assert rows["global_sliding_window"].endswith(f" window={WINDOW}, global_tokens={GLOBAL_TOKENS}")
    assert rows["varlen_block_causal"].endswith(f" block={BLOCK}, documents=auto, histogram=auto")
    assert rows["varlen_full_long"].endswith("long_fraction=0.6, long_min=8192, long_max=30720")
    assert rows["custom"].endswith(" slices (required), base_seqlen=auto")
    assert rows["block_sparse"].endswith(f" block={SPARSE_BLOCK}, density=0.25, causal=False")
    assert rows["block_sparse_heads"].endswith(f" kept=0.2, block={SPARSE_BLOCK}, heads=1, group=1")
    assert rows["variable_block_sparse_heads"].split()[1:] == ["kept=0.2,", "block=512,", "unit=128,", "heads=1,",
                                                               "group=1"]
    assert "Packed documents, causal within each." in out.stdout  # each pattern's description
