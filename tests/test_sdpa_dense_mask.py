"""SDPA's dense ``attn_mask``, built band by band on the cell's device from the slices' key
intervals: the same bool matrix as ``AttnMask.to_dense`` for every pattern."""

import pytest
import torch

from longca.attention import masks
from longca.kernels import sdpa


@pytest.mark.parametrize("pattern", sorted(masks.PATTERNS))
@pytest.mark.parametrize("seqlen", [1000, 2500])
def test_the_dense_mask_equals_the_slices_matrix(pattern, seqlen, monkeypatch):
    monkeypatch.setattr(sdpa, "DENSE_ROWS", 96)  # several bands per slice, a short last one
    mask = masks.build(pattern, seqlen)
    got = sdpa.dense_mask(mask, torch.device("cpu"))
    assert got.dtype == torch.bool and got.shape == (seqlen, seqlen)
    assert torch.equal(got, mask.to_dense())
