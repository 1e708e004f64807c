import math

import torch

from longca.attention import masks, reference


def naive(q, k, v, allowed):
    """Loop-per-element softmax attention: an independent check of the reference."""
    b, s, hq, d = q.shape
    hk = k.shape[2]
    out = torch.zeros_like(q)
    for bi in range(b):
        for h in range(hq):
            kh = h // (hq // hk)
            for i in range(s):
                js = [j for j in range(s) if allowed[i, j]]
                scores = torch.stack([q[bi, i, h] @ k[bi, j, kh] for j in js]) / math.sqrt(d)
                p = torch.softmax(scores, 0)
                out[bi, i, h] = sum(p[n] * v[bi, j, kh] for n, j in enumerate(js))
    return out


def test_matches_naive_loop_with_gqa():
    torch.manual_seed(0)
    s = 9
    q = torch.randn(2, s, 4, 8, dtype=torch.float64)
    k = torch.randn(2, s, 2, 8, dtype=torch.float64)
    v = torch.randn(2, s, 2, 8, dtype=torch.float64)
    for name in ("full", "causal"):
        m = masks.build(name, s)
        got = reference.attention(q, k, v, m)
        torch.testing.assert_close(got, naive(q, k, v, m.to_dense()), rtol=1e-12, atol=1e-12)


def test_matches_sdpa_math_float64():
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 33, 2, 16, dtype=torch.float64) for _ in range(3))
    m = masks.build("causal", 33)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    torch.testing.assert_close(reference.attention(q, k, v, m), expected, rtol=1e-12, atol=1e-12)


def test_empty_rows_give_zeros_not_nan():
    # A custom mask where query 0 attends nothing.
    m = masks.AttnMask("gap", 4, 4, (masks.AttnSlice(1, 4, 0, 4, masks.SliceKind.FULL),))
    q, k, v = (torch.randn(1, 4, 1, 8, dtype=torch.float64) for _ in range(3))
    out, lse = reference.attention(q, k, v, m, return_lse=True)
    assert torch.isfinite(out).all()
    assert (out[0, 0] == 0).all()
    assert lse[0, 0, 0] == float("-inf")
