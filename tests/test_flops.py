import pytest

from longca.attention import masks
from longca.attention.flops import attention_flops


@pytest.mark.parametrize("seqlen", [1, 7, 512, 1000])
def test_forward_counts_attended_pairs_only(seqlen):
    full = masks.build("full", seqlen)
    causal = masks.build("causal", seqlen)
    assert attention_flops(full, 8, 64, "fwd") == 4 * seqlen * seqlen * 8 * 64
    assert attention_flops(causal, 8, 64, "fwd") == 4 * (seqlen * (seqlen + 1) // 2) * 8 * 64


def test_backward_and_fwd_bwd_are_multiples_of_forward():
    m = masks.build("causal", 300)
    fwd = attention_flops(m, 4, 32, "fwd")
    assert attention_flops(m, 4, 32, "bwd") == pytest.approx(2.5 * fwd)
    assert attention_flops(m, 4, 32, "fwd_bwd") == pytest.approx(3.5 * fwd)
    assert attention_flops(m, 4, 32, "fwd", batch=3) == pytest.approx(3 * fwd)


def test_unknown_direction_is_named():
    with pytest.raises(ValueError, match="sideways"):
        attention_flops(masks.build("full", 8), 1, 8, "sideways")
