"""cuDNN's fused attention through its own Python frontend (``nvidia-cudnn-frontend``, ``import cudnn``).

Unlike ``sdpa_cudnn`` (PyTorch's SDPA, which can hand cuDNN only ``is_causal`` or a dense mask
tensor), this kernel builds cuDNN SDPA graphs itself, so the masks long-context training uses go
in natively:

* causal: ``diagonal_alignment`` + ``diagonal_band_right_bound=0``.  LongCA's CAUSAL slices are
  bottom-right aligned; on a square block (every benchmark mask, every CP piece) top-left is the
  same rule, so TOP_LEFT is used there and BOTTOM_RIGHT only when queries and keys differ in length;
* sliding windows: the diagonal band.  cuDNN attends ``i − left < j ≤ i + right`` (top-left), so
  a FlashAttention window ``(w_left, w_right)`` is ``left = w_left + 1``, ``right = w_right``;
* packed documents: one sequence of documents is a batch of variable-length sequences in THD
  layout — Q/K/V/O (and the softmax stats) carry ragged offsets (element offsets of each
  document's first token), ``seq_len_q/kv`` the document lengths, ``use_padding_mask=True``.

Which masks that is comes from ``_flash_masks`` (documents × causal × window, the same table the
FlashAttention-style kernels use); everything else is ``unsupported`` with the reason.  Graphs are
built and planned in ``prepare`` (cached per shape and mask; the workspace belongs to the cell's plan,
not to the cache: a deterministic backward's is tens of GiB), so a timed call only
executes a built plan.  The forward always produces the softmax stats (a training forward); the
backward is cuDNN's ``sdpa_backward`` graph fed those stats, behind a ``torch.autograd.Function``.
``lse_ops`` exposes the same graphs with the stats as the log-sum-exp for CP strategies.

API as in nvidia-cudnn-frontend 1.32 (``cudnn.pygraph``: ``tensor``, ``sdpa``, ``sdpa_backward``,
``set_ragged_offset``, ``validate`` → ``build_operation_graph`` → ``create_execution_plans`` →
``check_support`` → ``build_plans``, ``execute``).  A graph cuDNN will not run raises
``cudnn.cudnnGraphNotSupportedError``: that becomes ``Unsupported`` with cuDNN's message.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any

import torch

from ..attention.problem import Problem
from . import register
from ._flash_masks import NO_WINDOW, FlashMask, flash_mask, unsupported_reason
from ._library import Library
from ._lse_ops import LseOps
from .base import Kernel, Unsupported

DISTRIBUTION = "nvidia-cudnn-frontend"


# ---------------------------------------------------------------------------------------------
# The mask and the layout as cuDNN takes them: pure functions (tested on CPU).
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CudnnMask:
    """A mask as cuDNN's SDPA node takes it (per sequence of the batch)."""

    alignment: str            # cudnn.diagonal_alignment member: "TOP_LEFT" or "BOTTOM_RIGHT"
    left_bound: int | None    # diagonal_band_left_bound: keys j > i − left_bound; None = unbounded
    right_bound: int | None   # diagonal_band_right_bound: keys j ≤ i + right_bound (0 = causal)

    def kwargs(self) -> dict[str, Any]:
        """The ``sdpa`` / ``sdpa_backward`` keywords (alignment as a name; see ``_mask_kwargs``)."""
        out: dict[str, Any] = {"diagonal_alignment": self.alignment}
        if self.left_bound is not None:
            out["diagonal_band_left_bound"] = self.left_bound
        if self.right_bound is not None:
            out["diagonal_band_right_bound"] = self.right_bound
        return out


def band(causal: bool, window: tuple[int, int], seqlen_q: int, seqlen_k: int) -> CudnnMask:
    """FlashAttention's (causal, window ``(left, right)``, −1 = unbounded) as cuDNN's diagonal band.

    FlashAttention attends ``i − left ≤ j ≤ i + right``; cuDNN's band (TOP_LEFT) masks ``j ≤ i −
    left_bound`` and ``j > i + right_bound``, hence ``left_bound = left + 1``."""
    left, right = window
    right_bound = 0 if causal else (None if right < 0 else right)
    left_bound = None if left < 0 else left + 1
    # The alignment only places a band: bottom-right (LongCA's CAUSAL) and top-left coincide on a
    # square block, where TOP_LEFT, cuDNN's default, is used.
    banded = left_bound is not None or right_bound is not None
    alignment = "BOTTOM_RIGHT" if banded and seqlen_q != seqlen_k else "TOP_LEFT"
    return CudnnMask(alignment, left_bound, right_bound)


def cudnn_mask(problem: Problem) -> tuple[CudnnMask, FlashMask] | None:
    fm = flash_mask(problem)
    if fm is None:
        return None
    return band(fm.causal, fm.window, problem.mask.seqlen_q, problem.mask.seqlen_k), fm


def bshd_strides(seqlen: int, heads: int, head_dim: int) -> tuple[int, int, int, int]:
    """Strides of dims ``(b, h, s, d)`` over memory laid out ``(b, s, h, d)`` (LongCA's layout)."""
    return (seqlen * heads * head_dim, head_dim, heads * head_dim, 1)


def ragged_offsets(lengths: tuple[int, ...], heads: int, head_dim: int) -> list[int]:
    """Element offset of each sequence's first token in a packed ``(tokens, heads, head_dim)``
    buffer, plus the end: what cuDNN's ragged-offset tensors hold (``b + 1`` entries)."""
    out, pos = [0], 0
    for n in lengths:
        pos += n
        out.append(pos * heads * head_dim)
    return out


@dataclass(frozen=True)
class GraphKey:
    """Everything a cuDNN SDPA graph is built for; one graph per key (cached)."""

    device: str
    dtype: str                         # "bfloat16" / "float16"
    backward: bool
    batch: int                         # sequences (packed: documents × problem batch)
    heads_q: int
    heads_kv: int
    seqlen_q: int                      # per sequence (packed: the longest document)
    seqlen_kv: int
    head_dim: int
    mask: CudnnMask
    scale: float
    # Input strides, dims (b, h, s, d): q, k, v and for the backward o, dO.  Outputs are always
    # allocated (b, s, h, d) (``bshd_strides``).
    strides: tuple[tuple[int, ...], ...]
    lengths: tuple[int, ...] | None = None   # packed: every sequence's length (THD, ragged)
    deterministic: bool = False        # backward: cuDNN's use_deterministic_algorithm
    o_dtype: str | None = None         # fp8 forward: the output's dtype (None: the inputs')
    # v's, o's, dO's and dV's head dim where it differs from head_dim (MLA: 192/128); cuDNN's SDPA
    # takes d_qk ≠ d_v.  None: head_dim, and every graph is the one it was.
    head_dim_v: int | None = None

    @property
    def value_dim(self) -> int:
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def ragged(self) -> bool:
        return self.lengths is not None


def problem_key(problem: Problem, backward: bool, deterministic: bool = False,
                o_dtype: str | None = None) -> GraphKey:
    """The graph for a whole problem: ``(batch, seqlen, heads, head_dim)`` tensors, documents as
    ragged sequences (every sequence of the batch has the same documents)."""
    cm, fm = cudnn_mask(problem)
    b, s, hq, hkv, d = problem.batch, problem.seqlen, problem.heads_q, problem.heads_kv, problem.head_dim
    dv = problem.value_dim
    lengths = None
    if fm.packed:
        lengths = tuple(fm.documents) * b
        b, s = len(lengths), fm.max_document
    q = bshd_strides(s, hq, d)
    kv = bshd_strides(s, hkv, d)
    v, o = bshd_strides(s, hkv, dv), bshd_strides(s, hq, dv)  # k's and q's when dv == d
    strides = (q, kv, v) + ((o, o) if backward else ())
    return GraphKey(str(problem.device), str(problem.dtype).removeprefix("torch."), backward, b, hq, hkv, s, s, d,
                    cm, problem.head_dim ** -0.5, strides, lengths, deterministic and backward, o_dtype,
                    problem.head_dim_v)


# fp8 forward (``sdpa_fp8``): q, k, v are e4m3 with unit descales (LongCA's fp8 inputs are quantized
# with scale 1); P = softmax(S) is quantized with scale_s = 448, e4m3's largest value (P ≤ 1), as
# cuDNN's docs set it ("Amax S", no dropout).  An fp8 output is scaled by scale_o = 448 / amax(O),
# the amax taken on the plan's first call (delayed scaling with a one-call history, as
# TransformerEngine does from its amax history); a bf16 output needs no scale (Blackwell only).
E4M3_MAX = 448.0
FP8_SCALES = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")


def fp8_scale_values() -> dict[str, float]:
    return {"descale_q": 1.0, "descale_k": 1.0, "descale_v": 1.0, "descale_s": 1.0 / E4M3_MAX,
            "scale_s": E4M3_MAX, "scale_o": 1.0}


def fp8_mask_kwargs(mask: dict[str, Any]) -> dict[str, Any]:
    """``sdpa_fp8`` names the band's bounds ``left_bound`` / ``right_bound`` (``sdpa``:
    ``diagonal_band_left_bound`` / ``diagonal_band_right_bound``)."""
    renamed = {"diagonal_band_left_bound": "left_bound", "diagonal_band_right_bound": "right_bound"}
    return {renamed.get(k, k): v for k, v in mask.items()}


# ---------------------------------------------------------------------------------------------
# Graphs (GPU only).
# ---------------------------------------------------------------------------------------------

_import = Library(lambda: importlib.import_module("cudnn"), "cudnn", f"install {DISTRIBUTION}")


def _cudnn():
    mod = _import()
    if mod is None:
        raise RuntimeError(_import.missing())
    return mod


@functools.lru_cache(maxsize=None)
def _handle(device: str):
    with torch.cuda.device(torch.device(device)):
        return _cudnn().create_handle()


def _version() -> str:
    cudnn = _cudnn()
    try:
        backend = cudnn.backend_version_string()
    except Exception as exc:  # noqa: BLE001 — notes and messages only (e.g. libcudnn not loaded)
        backend = f"unknown: {exc}"
    return f"frontend {getattr(cudnn, '__version__', '?')}, cuDNN {backend}"


def _refused(exc: BaseException) -> bool:
    """cuDNN's "this graph is not supported" (frontend or backend), as opposed to a bug of ours."""
    cudnn = _cudnn()
    return isinstance(exc, (cudnn.cudnnGraphNotSupportedError, NotImplementedError))


class Graph:
    """One built cuDNN SDPA graph (forward or backward), its workspace and, packed, the device
    tensors of sequence lengths and ragged offsets it reads."""

    def __init__(self, key: GraphKey):
        cudnn = _cudnn()
        self.key = key
        self.handle = _handle(key.device)
        dev = torch.device(key.device)
        types = {"bfloat16": cudnn.data_type.BFLOAT16, "float16": cudnn.data_type.HALF,
                 "float8_e4m3fn": cudnn.data_type.FP8_E4M3}
        io = types[key.dtype]
        fp8 = key.dtype == "float8_e4m3fn"
        g = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=self.handle)
        b, hq, hkv, sq, skv, d = key.batch, key.heads_q, key.heads_kv, key.seqlen_q, key.seqlen_kv, key.head_dim
        q_dim, kv_dim, stats_dim = (b, hq, sq, d), (b, hkv, skv, d), (b, hq, sq, 1)
        # v, o, dO and dV are dv wide; with dv == d they are kv_dim and q_dim, as they always were.
        d_v = key.value_dim
        v_dim, o_dim = (b, hkv, skv, d_v), (b, hq, sq, d_v)
        # Ragged offsets of v and of o/dO: their own where dv differs, else k's and q's.
        v_off, o_off = ("v", "o") if key.head_dim_v is not None else ("kv", "q")
        self.t: dict[str, Any] = {}
        self.aux: dict[str, torch.Tensor] = {}

        def tensor(name, dim, stride, data_type=io):
            self.t[name] = g.tensor(name=name, dim=dim, stride=stride, data_type=data_type)
            return self.t[name]

        q, k, v = (tensor(n, dim, st) for n, dim, st in zip("qkv", (q_dim, kv_dim, v_dim), key.strides))
        mask = _mask_kwargs(cudnn, key.mask)
        offsets: dict[str, Any] = {}
        if key.ragged:
            # THD: sequence i's tokens start at offset[i] (elements) of the packed buffer.
            lengths = torch.tensor(key.lengths, dtype=torch.int32, device=dev).view(-1, 1, 1, 1)
            for name in ("seq_len_q", "seq_len_kv"):
                tensor(name, (b, 1, 1, 1), (1, 1, 1, 1), cudnn.data_type.INT32)
                self.aux[name] = lengths
            widths = [("q", hq, d), ("kv", hkv, d), ("stats", hq, 1)]
            if key.head_dim_v is not None:
                widths += [("v", hkv, d_v), ("o", hq, d_v)]
            for name, heads, width in widths:
                offsets[name] = tensor(f"{name}_offset", (b + 1, 1, 1, 1), (1, 1, 1, 1), cudnn.data_type.INT64)
                self.aux[f"{name}_offset"] = torch.tensor(ragged_offsets(key.lengths, heads, width),
                                                          dtype=torch.int64, device=dev).view(-1, 1, 1, 1)
            q.set_ragged_offset(offsets["q"])
            k.set_ragged_offset(offsets["kv"])
            v.set_ragged_offset(offsets[v_off])
            mask.update(use_padding_mask=True, seq_len_q=self.t["seq_len_q"], seq_len_kv=self.t["seq_len_kv"])
        # Packed stats are ragged too ((tokens, heads) in memory): padded they would take
        # sequences × longest × heads floats.
        stats_stride = bshd_strides(sq, hq, 1) if key.ragged else (hq * sq, sq, 1, 1)

        def output(t, name, dim, stride, offset=None, data_type=None):
            t.set_output(True).set_dim(list(dim)).set_stride(list(stride))
            if data_type is not None:
                t.set_data_type(data_type)
            if offset is not None:
                t.set_ragged_offset(offset)
            self.t[name] = t

        if not key.backward and fp8:
            scalar = ((1, 1, 1, 1), (1, 1, 1, 1), cudnn.data_type.FLOAT)
            scales = {name: tensor(name, *scalar) for name in FP8_SCALES}
            for name, value in fp8_scale_values().items():
                self.aux[name] = torch.full((1, 1, 1, 1), value, dtype=torch.float32, device=dev)
            o, stats, _amax_s, amax_o = g.sdpa_fp8(q, k, v, **scales, name="sdpa_fp8", generate_stats=True,
                                                   attn_scale=key.scale, **fp8_mask_kwargs(mask))
            output(o, "o", o_dim, bshd_strides(sq, hq, d_v), offsets.get(o_off), types[key.o_dtype or key.dtype])
            output(stats, "stats", stats_dim, stats_stride, offsets.get("stats"), cudnn.data_type.FLOAT)
            output(amax_o, "amax_o", (1, 1, 1, 1), (1, 1, 1, 1), None, cudnn.data_type.FLOAT)
            self.aux["amax_o"] = torch.zeros((1, 1, 1, 1), dtype=torch.float32, device=dev)
        elif not key.backward:
            o, stats = g.sdpa(q, k, v, name="sdpa", generate_stats=True, attn_scale=key.scale, **mask)
            output(o, "o", o_dim, bshd_strides(sq, hq, d_v), offsets.get(o_off))
            output(stats, "stats", stats_dim, stats_stride, offsets.get("stats"), cudnn.data_type.FLOAT)
        else:
            o = tensor("o", o_dim, key.strides[3])
            do = tensor("do", o_dim, key.strides[4])
            stats = tensor("stats", stats_dim, stats_stride, cudnn.data_type.FLOAT)
            if key.ragged:
                for t, name in ((o, o_off), (do, o_off), (stats, "stats")):
                    t.set_ragged_offset(offsets[name])
                # Sizes the backward's float32 workspace by the real token count, not b × longest.
                mask.update(max_total_seq_len_q=sum(key.lengths), max_total_seq_len_kv=sum(key.lengths))
            if key.deterministic:
                mask["use_deterministic_algorithm"] = True
            dq, dk, dv = g.sdpa_backward(q, k, v, o, do, stats, name="sdpa_backward", attn_scale=key.scale, **mask)
            output(dq, "dq", q_dim, bshd_strides(sq, hq, d), offsets.get("q"))
            output(dk, "dk", kv_dim, bshd_strides(skv, hkv, d), offsets.get("kv"))
            output(dv, "dv", v_dim, bshd_strides(skv, hkv, d_v), offsets.get(v_off))
        try:
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            g.check_support()
            g.build_plans()
        except Exception as exc:  # noqa: BLE001 — classified just below
            if not _refused(exc):
                raise
            what = "backward" if key.backward else "forward"
            raise Unsupported(f"cudnn_fe: cuDNN ({_version()}) refused the {what} graph "
                              f"({_describe(key)}): {type(exc).__name__}: {exc}") from exc
        self.graph = g
        self.workspace_bytes = max(1, g.get_workspace_size())
        self.plan = _plan_name(g)

    def new_workspace(self) -> torch.Tensor:
        # Held by whoever runs the graph (a cell's Plan, one CP block call), never by the graph
        # cache: a cached 131 GiB workspace (the deterministic backward at 32K on an H200) outlived
        # its cell and left the next process 8.9 GiB.
        return torch.empty(self.workspace_bytes, dtype=torch.uint8, device=torch.device(self.key.device))

    def run(self, workspace: torch.Tensor | None = None, **buffers: torch.Tensor) -> None:
        """Execute on the current stream: inputs and preallocated outputs by name."""
        cudnn = _cudnn()
        cudnn.set_stream(self.handle, torch.cuda.current_stream(torch.device(self.key.device)).cuda_stream)
        pack = {self.t[name]: tensor for name, tensor in buffers.items()}
        pack.update((self.t[name], tensor) for name, tensor in self.aux.items())
        self.graph.execute(pack, self.new_workspace() if workspace is None else workspace, handle=self.handle)


def _mask_kwargs(cudnn, mask: CudnnMask) -> dict[str, Any]:
    kwargs = mask.kwargs()
    kwargs["diagonal_alignment"] = getattr(cudnn.diagonal_alignment, kwargs["diagonal_alignment"])
    return kwargs


def _describe(key: GraphKey) -> str:
    layout = f"THD, {key.batch} sequences ≤ {key.seqlen_q}" if key.ragged else f"b={key.batch}, s={key.seqlen_q}"
    dims = f"d={key.head_dim}" if key.head_dim_v is None else f"d={key.head_dim}, d_v={key.head_dim_v}"
    return (f"{key.dtype}, {layout}, heads {key.heads_q}:{key.heads_kv}, {dims}, "
            f"{key.mask.alignment} band ({key.mask.left_bound}, {key.mask.right_bound})")


def _plan_name(g) -> str | None:
    try:  # notes only: which engine (backend plan or frontend Python engine) serves the graph
        return str(g.get_plan_name_at_index(getattr(g, "_plan_index", 0)))
    except Exception:  # noqa: BLE001
        return None


@functools.lru_cache(maxsize=64)
def graph(key: GraphKey) -> Graph:
    return Graph(key)


# ---------------------------------------------------------------------------------------------
# The kernel: a whole problem, forward and backward.
# ---------------------------------------------------------------------------------------------

@dataclass
class Plan:
    fwd: Graph
    bwd: Graph | None
    stats_shape: tuple[int, ...]  # packed: (tokens, heads, 1); else (b, heads, s, 1)
    fwd_workspace: torch.Tensor | None = None
    bwd_workspace: torch.Tensor | None = None

    calibrated: bool = False

    def forward(self, q, k, v):
        o_dtype = self.fwd.key.o_dtype
        # (b, s, hq, v's head dim): q's shape when the head dims agree.
        out = q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=getattr(torch, o_dtype) if o_dtype else q.dtype)
        stats = torch.empty(self.stats_shape, dtype=torch.float32, device=q.device)
        self.fwd.run(self.fwd_workspace, q=q, k=k, v=v, o=out, stats=stats)
        if out.dtype == torch.float8_e4m3fn and not self.calibrated:
            # The first call (the gate's, or the warm-up's) sets O's scale from its own amax.
            amax = self.fwd.aux["amax_o"].clamp_min(1e-30)
            self.fwd.aux["scale_o"].copy_(E4M3_MAX / amax)
            self.calibrated = True
            self.fwd.run(self.fwd_workspace, q=q, k=k, v=v, o=out, stats=stats)
        return out, stats

    def dequantize(self, out: torch.Tensor) -> torch.Tensor:
        if out.dtype != torch.float8_e4m3fn:
            return out
        return out.to(torch.float32) / self.fwd.aux["scale_o"].reshape(())

    def backward(self, q, k, v, out, stats, dout):
        if self.bwd is None:
            raise RuntimeError("cudnn_fe: no backward graph (prepare builds it for a backward problem)")
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self.bwd.run(self.bwd_workspace, q=q, k=k, v=v, o=out, do=dout, stats=stats, dq=dq, dk=dk, dv=dv)
        return dq, dk, dv


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plan: Plan):
        # The graphs are built for contiguous (b, s, h, d) tensors (a no-op for such inputs).
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, stats = plan.forward(q, k, v)
        ctx.save_for_backward(q, k, v, out, stats)
        ctx.plan = plan
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, out, stats = ctx.saved_tensors
        dq, dk, dv = ctx.plan.backward(q, k, v, out, stats, dout.contiguous())
        return dq, dk, dv, None


class CudnnFrontend(Kernel):
    name = "cudnn_fe"
    libraries = ("nvidia-cudnn-frontend", "cudnn")
    description = "cuDNN SDPA graphs via nvidia-cudnn-frontend: causal, sliding window, THD documents natively"
    devices = ("cuda",)
    # cuDNN's SDPA takes d_qk ≠ d_v (forward and backward); the graph's v, o, dO and dV are built v's
    # width (problem_key, Graph).  Not run on a GPU by LongCA yet: the first 192/128 cells are its check
    # (a graph cuDNN declines is an ``unsupported`` row saying so).
    takes_head_dim_v = True
    # 16-bit inputs through ``sdpa``; fp8 (e4m3) forward through ``sdpa_fp8``.
    dtypes = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)
    fp8_backward_missing = ("cuDNN has one (sdpa_fp8_backward, with fp8 O, dO and their scales); "
                            "LongCA does not drive it yet")
    # fp8_output: the fp8 forward's output dtype, "float8_e4m3fn" (scaled, see E4M3_MAX) or
    # "bfloat16", which cuDNN 9.19 builds on Blackwell only (on an H200 it declines the graph, saying so).
    options = {"fp8_output": "float8_e4m3fn"}

    def available(self) -> str | None:
        if error := _import.missing():
            return error
        if not torch.cuda.is_available():
            return "cudnn_fe needs a CUDA device (cuDNN's SDPA runs on NVIDIA GPUs); torch sees none"
        return None

    def supports_mask(self, problem: Problem) -> str | None:
        return unsupported_reason(self.name, problem)

    def prepare(self, problem: Problem) -> dict[str, Any]:
        o_dtype = None
        if problem.dtype == torch.float8_e4m3fn:
            o_dtype = self.options["fp8_output"]
            if o_dtype not in ("bfloat16", "float8_e4m3fn"):
                raise ValueError(f"cudnn_fe: kernel_options.cudnn_fe.fp8_output must be bfloat16 or "
                                 f"float8_e4m3fn, got {o_dtype!r}")
        fwd = graph(problem_key(problem, backward=False, o_dtype=o_dtype))
        bwd = (graph(problem_key(problem, backward=True, deterministic=self.deterministic))
               if problem.direction == "bwd" else None)
        key = fwd.key
        if key.ragged:
            stats_shape = (problem.batch * problem.seqlen, key.heads_q, 1)
        else:
            stats_shape = (key.batch, key.heads_q, key.seqlen_q, 1)
        plan = Plan(fwd, bwd, stats_shape, fwd.new_workspace(), bwd.new_workspace() if bwd else None)
        return {"plan": plan, "diagonal_alignment": key.mask.alignment,
                "left_bound": key.mask.left_bound, "right_bound": key.mask.right_bound,
                "layout": "thd" if key.ragged else "bshd", "sequences": key.batch,
                "fwd_plan": fwd.plan, "bwd_plan": bwd.plan if bwd else None, "version": _version(),
                "fwd_workspace_bytes": fwd.workspace_bytes, "bwd_workspace_bytes": bwd.workspace_bytes if bwd else None,
                **({"fp8_output": o_dtype, "fp8_scales": "unit descales; scale_s 448; scale_o 448/amax(O) "
                    "of the first call" if o_dtype == "float8_e4m3fn" else "unit descales; scale_s 448"}
                   if o_dtype else {})}

    def forward(self, q, k, v, prepared):
        return _Attention.apply(q, k, v, prepared["plan"])

    def dequantize(self, out, prepared):
        return prepared["plan"].dequantize(out)

    def notes(self, prepared: dict[str, Any]) -> dict[str, Any]:
        # None-valued entries (an unbounded side, no backward plan) say so explicitly.
        return {k: v for k, v in prepared.items() if k != "plan"}

    def lse_ops(self, device: torch.device):
        if torch.device(device).type != "cuda" or self.available():
            return None
        return CudnnLseOps()


# ---------------------------------------------------------------------------------------------
# CP local kernel: one (query shard, key shard) block with its LSE.
# ---------------------------------------------------------------------------------------------

class CudnnLseOps(LseOps):
    """cuDNN graphs on ``(b, h, s, d)`` blocks (KV heads expanded by the caller; views of any
    strides: the graph is built for them, one per block shape, cached).  The stats cuDNN returns are
    the natural-log LSE; the backward graph takes the CP's *global* output and LSE."""

    modes = frozenset({"full", "causal"})

    @staticmethod
    def _key(q, k, causal, scale, strides, backward) -> GraphKey:
        b, h, sq, d = q.shape
        mask = band(causal, NO_WINDOW, sq, k.shape[2])
        return GraphKey(str(q.device), str(q.dtype).removeprefix("torch."), backward, b, h, k.shape[1], sq,
                        k.shape[2], d, mask, float(scale), tuple(tuple(t.stride()) for t in strides))

    @staticmethod
    def _bshd(like: torch.Tensor) -> torch.Tensor:
        b, h, s, d = like.shape
        return torch.empty(b, s, h, d, dtype=like.dtype, device=like.device).transpose(1, 2)

    def forward(self, q, k, v, causal, bias, scale):
        g = graph(self._key(q, k, causal, scale, (q, k, v), backward=False))
        out = self._bshd(q)
        b, h, s, _ = q.shape
        stats = torch.empty(b, h, s, 1, dtype=torch.float32, device=q.device)
        g.run(q=q, k=k, v=v, o=out, stats=stats)
        return out, stats.squeeze(-1)

    def backward(self, dout, q, k, v, out, lse, causal, bias, scale):
        g = graph(self._key(q, k, causal, scale, (q, k, v, out, dout), backward=True))
        dq, dk, dv = self._bshd(q), self._bshd(k), self._bshd(v)
        # Rows with no key anywhere carry lse = +inf (BlockAttention.backward_lse): P = 0 there.
        stats = lse.float().unsqueeze(-1).contiguous()
        g.run(q=q, k=k, v=v, o=out, do=dout, stats=stats, dq=dq, dk=dk, dv=dv)
        return dq, dk, dv


class CudnnFrontendDeterministic(CudnnFrontend):
    """cudnn_fe with cuDNN's deterministic backward (``use_deterministic_algorithm=True``): its
    backward rows sit beside cudnn_fe's in the same run."""

    name = "cudnn_fe_deterministic"
    description = "cudnn_fe with the deterministic backward (sdpa_backward use_deterministic_algorithm)"
    deterministic = True

    def lse_ops(self, device: torch.device):
        return None  # CP strategies take the default kernel's blocks


register(CudnnFrontend())
register(CudnnFrontendDeterministic())
