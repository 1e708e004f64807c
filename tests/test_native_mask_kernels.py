"""The kernels that take masks natively (cuDNN frontend, FlashAttention-4, FlexAttention on FA4):
their mask → library-parameter translations, checked against the masks' own dense patterns, and
what they say on a machine without their GPU libraries.  The GPU paths themselves run in
``longca check`` on a GPU box (docs/kernels.md)."""

import inspect

import pytest
import torch

from longca import kernels
from longca.attention.masks import AttnSlice, SliceKind
from longca.attention.problem import Problem
from longca.cp import local
from longca.execution.measure.cell import CellSpec, run_cell
from longca.execution.measure.check import check
from longca.kernels import cudnn_frontend as cf
from longca.kernels import flash_attn, flex
from longca.kernels._flash_masks import NO_WINDOW, SUPPORTED, flash_mask
from longca.kernels.base import Unsupported

NEW = ("cudnn_fe", "flex_flash", "flash_attn4")


def _problem(mask, seqlen=256, batch=1, direction="fwd", **params):
    return Problem(mask, seqlen, batch, 4, 2, 32, torch.bfloat16, "cpu", direction, 1, params)


def _params(mask):
    if "window" in mask:
        return {"window": 40}
    if mask.startswith("varlen"):
        return {"documents": [60, 100, 96]}
    return {}


# --- cuDNN: the diagonal band, read back as cuDNN defines it ------------------------------------

def _cudnn_allows(cm: cf.CudnnMask, sq: int, sk: int) -> torch.Tensor:
    """The pairs cuDNN attends for one sequence, written from cuDNN's own reference
    (cudnn-frontend test/python/sdpa/fp16_ref.py): TOP_LEFT masks ``j − i ≥ 1 + right`` and
    ``j − i ≤ −left``; BOTTOM_RIGHT shifts both diagonals by ``sk − sq``."""
    i = torch.arange(sq).unsqueeze(1)
    j = torch.arange(sk).unsqueeze(0)
    shift = sk - sq if cm.alignment == "BOTTOM_RIGHT" else 0
    allowed = torch.ones(sq, sk, dtype=torch.bool)
    if cm.right_bound is not None:
        allowed &= j - i < 1 + cm.right_bound + shift
    if cm.left_bound is not None:
        allowed &= j - i > -cm.left_bound + shift
    return allowed


@pytest.mark.parametrize("mask", SUPPORTED)
def test_cudnn_band_and_documents_reproduce_every_supported_mask(mask):
    p = _problem(mask, **_params(mask))
    cm, fm = cf.cudnn_mask(p)
    dense = torch.zeros(p.seqlen, p.seqlen, dtype=torch.bool)
    start = 0
    for n in fm.documents:  # documents = independent sequences of a THD batch
        dense[start:start + n, start:start + n] = _cudnn_allows(cm, n, n)
        start += n
    assert torch.equal(dense, p.mask.to_dense())


@pytest.mark.parametrize("causal, window, sq, sk, expect", [
    (False, NO_WINDOW, 256, 256, ("TOP_LEFT", None, None)),
    (True, NO_WINDOW, 256, 256, ("TOP_LEFT", None, 0)),
    (False, (40, 40), 256, 256, ("TOP_LEFT", 41, 40)),
    (True, (40, 0), 256, 256, ("TOP_LEFT", 41, 0)),
    (True, NO_WINDOW, 3, 5, ("BOTTOM_RIGHT", None, 0)),   # LongCA's CAUSAL is bottom-right aligned
    (False, NO_WINDOW, 3, 5, ("TOP_LEFT", None, None)),   # no band: the alignment is moot
])
def test_cudnn_band_parameters(causal, window, sq, sk, expect):
    cm = cf.band(causal, window, sq, sk)
    assert (cm.alignment, cm.left_bound, cm.right_bound) == expect


@pytest.mark.parametrize("lq, lk", [(3, 5), (5, 5), (7, 4)])
def test_cudnn_causal_is_bottom_right_like_a_causal_slice(lq, lk):
    s = AttnSlice(0, lq, 0, lk, SliceKind.CAUSAL)
    assert torch.equal(_cudnn_allows(cf.band(True, NO_WINDOW, lq, lk), lq, lk), s.dense())


def test_cudnn_mask_keywords_leave_out_unbounded_sides():
    assert cf.band(True, NO_WINDOW, 8, 8).kwargs() == {"diagonal_alignment": "TOP_LEFT", "diagonal_band_right_bound": 0}
    assert cf.band(False, (3, 2), 8, 8).kwargs() == {"diagonal_alignment": "TOP_LEFT", "diagonal_band_left_bound": 4,
                                                      "diagonal_band_right_bound": 2}


def test_ragged_offsets_are_element_offsets_of_each_document():
    assert cf.ragged_offsets((100, 156), 8, 64) == [0, 100 * 8 * 64, 256 * 8 * 64]
    assert cf.ragged_offsets((3,), 4, 1) == [0, 12]  # the stats: (tokens, heads, 1)


def test_cudnn_graph_key_packs_documents_as_thd_sequences():
    p = _problem("varlen_causal", seqlen=256, batch=2, direction="bwd", documents=[60, 100, 96])
    key = cf.problem_key(p, backward=True)
    assert key.ragged and key.lengths == (60, 100, 96) * 2
    assert (key.batch, key.seqlen_q, key.seqlen_kv) == (6, 100, 100)
    assert key.strides == ((100 * 4 * 32, 32, 4 * 32, 1), (100 * 2 * 32, 32, 2 * 32, 1), (100 * 2 * 32, 32, 2 * 32, 1),
                           (100 * 4 * 32, 32, 4 * 32, 1), (100 * 4 * 32, 32, 4 * 32, 1))
    assert key.scale == pytest.approx(32 ** -0.5)
    dense = cf.problem_key(_problem("causal", batch=2), backward=False)
    assert not dense.ragged and (dense.batch, dense.seqlen_q) == (2, 256) and len(dense.strides) == 3
    assert dense.strides[0] == (256 * 4 * 32, 32, 4 * 32, 1)  # (b, h, s, d) dims over (b, s, h, d) memory


def test_cudnn_lse_ops_key_follows_the_block_views():
    q = torch.zeros(1, 64, 4, 16).transpose(1, 2)[:, :, 8:40]     # a CP query shard: a strided view
    k = torch.zeros(1, 4, 64, 16)[:, :, 8:40]
    key = cf.CudnnLseOps._key(q, k, True, 0.25, (q, k, k), backward=False)
    assert key.mask == cf.CudnnMask("TOP_LEFT", None, 0)
    assert key.strides == ((64 * 4 * 16, 16, 4 * 16, 1), (4 * 64 * 16, 64 * 16, 16, 1), (4 * 64 * 16, 64 * 16, 16, 1))
    assert (key.batch, key.heads_q, key.heads_kv, key.seqlen_q, key.seqlen_kv) == (1, 4, 4, 32, 32)


@pytest.mark.parametrize("mask", ["shared_question", "causal_blockwise", "prefix_lm_causal", "prefix_lm_varlen",
                                  "global_sliding_window", "varlen_block_causal", "block_sparse"])
def test_cudnn_refuses_what_band_and_documents_cannot_say(mask):
    params = {"block": 64} if mask == "block_sparse" else {}
    reason = kernels.get("cudnn_fe").supports_mask(_problem(mask, **params))
    assert reason and "documents × (full | causal | sliding window)" in reason and mask in reason


# --- FlashAttention: the window keywords per release ------------------------------------------------

def _fa4_flash_attn_func(q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None, causal=False,
                         window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
                         deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None, aux_tensors=None,
                         aux_scalars=None, block_sparse_tensors=None, block_sparse_tensors_bwd=None, return_lse=False,
                         gather_bwd_recompute_p=False, gather_bwd_token_chunk=None):
    """flash-attn-4 4.0.0b36's ``flash_attn.cute.flash_attn_func`` signature (its parameters only)."""


def _params_of(fn):
    return tuple(inspect.signature(fn).parameters)


@pytest.mark.parametrize("params, causal, window, unbounded, expect", [
    (_params_of(_fa4_flash_attn_func), True, (40, 0), None, {"causal": True, "window_size": (40, 0)}),
    (_params_of(_fa4_flash_attn_func), False, (40, 40), None, {"causal": False, "window_size": (40, 40)}),
    (_params_of(_fa4_flash_attn_func), True, (40, -1), None, {"causal": True, "window_size": (40, None)}),
    (_params_of(_fa4_flash_attn_func), True, NO_WINDOW, None, {"causal": True}),
    (("q", "k", "v", "causal", "window_size"), False, (40, -1), -1, {"causal": False, "window_size": (40, -1)}),  # FA2
    (("q", "k", "v", "causal", "window_size_left", "window_size_right"), True, (40, 0), None,
     {"causal": True, "window_size_left": 40, "window_size_right": 0}),  # earlier FA4 (cute) releases
])
def test_flash_window_keywords(params, causal, window, unbounded, expect):
    assert flash_attn.mask_kwargs(params, causal, window, unbounded) == expect


def test_flash_attn4_writes_an_unbounded_window_side_as_none():
    fa4 = kernels.get("flash_attn4")
    assert fa4.unbounded is None and kernels.get("flash_attn2").unbounded == -1
    assert fa4.lse_ops_class is flash_attn.Fa4LseOps and fa4.lse_ops_class.modes == {"full", "causal"}


@pytest.mark.parametrize("mask", SUPPORTED)
def test_flash_attn4_and_cudnn_take_the_same_masks(mask):
    p = _problem(mask, **_params(mask))
    assert flash_mask(p) is not None
    assert kernels.get("flash_attn4").supports_mask(p) is None
    assert kernels.get("cudnn_fe").supports_mask(p) is None


# --- FlexAttention on FLASH: a refusal is unsupported, anything else an error ----------------------

class _Wrapped(Exception):
    """What Dynamo/Inductor raise around a lowering error (InductorError keeps it as inner_exception)."""

    def __init__(self, inner):
        super().__init__(f"{type(inner).__name__}: {inner}")
        self.inner_exception = inner


def _raised_in(path: str, source: str) -> BaseException:
    try:
        exec(compile(source, path, "exec"), {})
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("did not raise")


@pytest.mark.parametrize("exc, expect", [
    (_Wrapped(RuntimeError("BACKEND='FLASH' but flash attention cannot be used: Input buffers require gradients")),
     "Input buffers require gradients"),
    (_Wrapped(NotImplementedError("FLASH backend backward does not support differentiating through logsumexp")),
     "logsumexp"),
    (_Wrapped(RuntimeError("CuteDSL template failed: unsupported op")), "CuteDSL template failed"),
    (_raised_in("/site-packages/flash_attn/cute/interface.py", "assert False, 'inputs must be float16 or bfloat16'"),
     "FlashAttention-4 refused it: AssertionError: inputs must be float16 or bfloat16"),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), None),
    (_raised_in("/work/longca/mine.py", "assert False, 'a bug of ours'"), None),
])
def test_flash_refusals_are_told_apart_from_failures(exc, expect):
    reason = flex.flash_refusal(exc)
    assert (reason is None) if expect is None else (expect in reason)


def test_flex_flash_prepare_turns_a_refusal_into_unsupported_with_torchs_reason(monkeypatch):
    k = kernels.get("flex_flash")
    refusal = RuntimeError("BACKEND='FLASH' but flash attention cannot be used: NYI: captured grads")

    def refuse(problem):
        raise _Wrapped(refusal)

    monkeypatch.setattr(k, "_compile_everything", refuse)
    with pytest.raises(Unsupported, match="FLASH backend refused this problem.*NYI: captured grads"):
        k.prepare(_problem("causal"))

    def crash(problem):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(k, "_compile_everything", crash)
    with pytest.raises(RuntimeError, match="illegal memory access"):  # a crash stays an error
        k.prepare(_problem("causal"))


def test_flex_flash_compiles_whole_graphs_with_the_flash_backend():
    k = kernels.get("flex_flash")
    assert k.flex_kernel_options == {"BACKEND": "FLASH"} and k.fullgraph
    assert kernels.get("flex").flex_kernel_options is None
    assert k.devices == ("cuda",) and k.dtypes == kernels.get("flex").dtypes  # FA4 itself refuses float32
    assert k.supports_mask(_problem("prefix_lm_varlen")) is None  # every mask Flex expresses


# --- the Unsupported → row path, and what a CPU machine says ---------------------------------------

def test_a_library_refusal_in_prepare_is_an_unsupported_row_with_its_reason():
    from longca.kernels.testing import RefusingKernel

    row = run_cell(CellSpec(kernel="test_refuses", mask="causal", seqlen=64, heads_q=2, heads_kv=1, head_dim=16,
                            gate_seqlen=64))
    assert row["status"] == "unsupported" and row["reason"] == RefusingKernel.REASON
    assert "median_ms" not in row and "gate_error" not in row


def test_check_reports_a_refusal_as_unsupported():
    (result,) = check(["test_refuses"], ["full"], ["fwd"], device="cpu", dtype="float32", seqlen=64, heads_q=2,
                      heads_kv=1, head_dim=16)
    assert (result.status, result.detail) == ("unsupported", kernels.get("test_refuses").REASON)


def test_cp_and_kernels_share_one_unsupported():
    from longca.cp import base

    assert base.Unsupported is Unsupported


@pytest.mark.parametrize("kernel", NEW)
def test_new_kernels_without_their_libraries_say_why(kernel):
    k = kernels.get(kernel)
    reason = k.available()
    assert reason and "not importable" in reason  # this machine has neither cudnn nor flash_attn
    row = run_cell(CellSpec(kernel=kernel, mask="varlen_causal", seqlen=256, dtype="bfloat16", gate_seqlen=256))
    assert row["status"] == "unsupported" and reason in row["reason"]
    assert k.lse_ops("cpu") is None
    with pytest.raises(Unsupported, match="not importable"):
        local.BlockAttention(kernel, torch.device("cpu"), 4, 2, 32)


def test_new_kernels_are_listed_with_their_availability():
    from test_kernels import _cli

    out = _cli("kernels")
    assert out.returncode == 0
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    # On this CPU machine they need CUDA, and their libraries are missing too: both are said.
    assert "cudnn is not importable" in lines["cudnn_fe"]
    assert "flash_attn.cute is not importable" in lines["flex_flash"]
    assert "flash_attn.cute is not importable" in lines["flash_attn4"]


def test_an_exception_torch_handled_on_the_way_is_not_a_refusal():
    try:
        try:
            raise NotImplementedError("a fast path torch tried and skipped")
        except NotImplementedError:
            raise RuntimeError("CUDA error: misaligned address")
    except RuntimeError as exc:
        assert flex.flash_refusal(exc) is None
