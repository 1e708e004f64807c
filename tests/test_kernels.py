"""Every CPU-capable kernel against the float64 reference on every pattern, and the adapters'
declared limits (what they refuse, and why)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from longca import kernels
from longca.attention.masks import HEAD_PATTERNS
from longca.attention.problem import Problem
from longca.execution.measure.cell import CellSpec, run_cell
from longca.execution.measure.check import check, check_masks
from longca.kernels._flash_masks import flash_mask

CPU_KERNELS = [n for n in kernels.names()
               if "cpu" in kernels.get(n).devices and not kernels.get(n).available() and not n.startswith("test_")]


def test_cpu_kernels_include_the_torch_families():
    assert {"sdpa_math", "sdpa", "sdpa_flash", "flex"} <= set(CPU_KERNELS)


@pytest.mark.parametrize("kernel", CPU_KERNELS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_cpu_kernel_is_right_on_every_pattern(kernel, dtype):
    results = check([kernel], check_masks(), ["fwd", "bwd"], device="cpu", dtype=dtype, seqlen=320,
                    heads_q=4, heads_kv=2, head_dim=32)
    bad = [r for r in results if r.status not in ("ok", "unsupported")]
    assert not bad, bad
    ran = [r for r in results if r.status == "ok"]
    assert ran, f"{kernel} ran nothing"
    # Everything refused says why.
    assert all(r.detail for r in results if r.status == "unsupported")


def test_dense_mask_kernels_run_every_pattern_forward_and_backward():
    for kernel in ("sdpa_math", "sdpa"):
        results = check([kernel], check_masks(), ["fwd", "bwd"], device="cpu", dtype="float32", seqlen=256,
                        heads_q=2, heads_kv=1, head_dim=16)
        one_mask = [r for r in results if r.mask not in HEAD_PATTERNS]
        assert {r.status for r in one_mask} == {"ok"}, [r for r in one_mask if r.status != "ok"]
        # A pattern per KV head needs a kernel that takes one (flex_block_sparse, ffa_block_sparse, vsa_triton).
        per_head = [r for r in results if r.mask in HEAD_PATTERNS]
        assert {r.mask for r in per_head} == set(HEAD_PATTERNS)
        assert all(r.status == "unsupported" and "one mask for every head" in r.detail for r in per_head)


def test_flex_runs_every_pattern_forward_on_cpu_and_says_why_not_backward():
    results = check(["flex"], check_masks(), ["fwd", "bwd"], device="cpu", dtype="float32", seqlen=256,
                    heads_q=2, heads_kv=1, head_dim=16)
    assert {r.status for r in results if r.direction == "fwd" and r.mask not in HEAD_PATTERNS} == {"ok"}
    assert all(r.status == "unsupported" and "backward" in r.detail for r in results
               if r.direction == "bwd" and r.mask not in HEAD_PATTERNS)


def test_flex_row_on_block_sparse_counts_only_attended_flops():
    row = run_cell(CellSpec(kernel="flex", mask="block_sparse", seqlen=512, heads_q=2, heads_kv=1, head_dim=16,
                            mask_params={"block": 128, "density": 0.25}, warmup=0, reps=2, gate_seqlen=256))
    assert row["status"] == "ok", row["reason"]
    assert row["flops"] == 4 * row["area"] * 2 * 16
    assert row["density"] == pytest.approx(0.25)  # 1 of 4 key tiles per query tile
    notes = json.loads(row["notes"])
    assert notes["tile_density"] == pytest.approx(0.25) and notes["inference_only"] is True


@pytest.mark.parametrize("mask, expect", [
    ("full", (False, (-1, -1), 1)),
    ("causal", (True, (-1, -1), 1)),
    ("sliding_window_causal", (True, (40, 0), 1)),
    ("sliding_window", (False, (40, 40), 1)),
    ("varlen_causal", (True, (-1, -1), None)),
    ("prefix_lm_causal", None),
    ("block_sparse", None),
])
def test_flash_style_kernels_see_documents_and_windows(mask, expect):
    params = {"window": 40} if "window" in mask else {}
    if mask == "varlen_causal":
        params = {"documents": [100, 156]}
    p = Problem(mask, 256, 1, 2, 1, 16, torch.bfloat16, "cpu", "fwd", 0, params)
    fm = flash_mask(p)
    if expect is None:
        assert fm is None
        return
    causal, window, ndocs = expect
    assert (fm.causal, fm.window) == (causal, window)
    assert fm.documents == ((256,) if ndocs == 1 else (100, 156))


@pytest.mark.parametrize("kernel", ["flash_attn2", "flash_attn3", "flash_attn4", "xformers", "te_fused", "varlen_attn",
                                    "sdpa_cudnn", "sdpa_efficient"])
def test_gpu_and_optional_kernels_are_unsupported_here_with_the_reason(kernel):
    row = run_cell(CellSpec(kernel=kernel, mask="causal", seqlen=128, dtype="bfloat16"))
    assert row["status"] == "unsupported"
    k = kernels.get(kernel)
    assert k.available() is None or k.available() in row["reason"]
    assert "not importable" in row["reason"] or "runs on cuda" in row["reason"]


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-W", "ignore", "-m", "longca", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)


def test_check_cli_passes_on_the_cpu_kernels():
    out = _cli("check", "--kernels", "sdpa_math", "flex", "--masks", "causal", "varlen_causal", "block_sparse",
               "--seqlen", "256")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "summary: ok 9, unsupported 3" in out.stdout


def test_check_cli_fails_on_a_wrong_kernel():
    out = _cli("check", "--kernels", "sdpa_math", "test_wrong", "--masks", "causal", "--directions", "fwd",
               "--seqlen", "128", env={"LONGCA_TEST_KERNELS": "1"})
    assert out.returncode == 1
    assert "test_wrong" in out.stdout and " wrong " in out.stdout


# The listings below are a machine's without CUDA (the CPU test suite's).
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="expects the listing of a machine without CUDA")


@NO_CUDA
def test_kernels_cli_lists_every_kernel_with_its_availability_per_device_here():
    """On this CPU-only machine: a CUDA-only kernel is unavailable here whatever its library says;
    a CPU kernel is available on cpu; a missing library is named."""
    out = _cli("kernels")
    assert out.returncode == 0
    listing = {line.split()[0]: line for line in out.stdout.splitlines()}
    assert {n for n in kernels.names() if not n.startswith("test_")} <= set(listing)
    for name in ("sdpa_cudnn", "sdpa_efficient", "varlen_attn"):  # their library is torch itself
        assert " unavailable here: needs CUDA " in listing[name], listing[name]
    assert "unavailable here: needs CUDA (and flash_attn is not importable" in listing["flash_attn2"]
    for name in ("sdpa", "sdpa_math", "sdpa_flash", "flex"):
        assert " available on cpu " in listing[name], listing[name]
    # Every line says where it runs here, or why it does not.
    assert all(" available on " in line or " unavailable" in line for line in listing.values())


@pytest.mark.parametrize("args, says", [
    (("--kernels", "nosuch", "sdpa_math"), "longca check: unknown kernel 'nosuch'; known: "),
    (("--masks", "causal", "causl", "fulll"), "longca check: unknown masks 'causl', 'fulll'; known: full, causal,"),
])
def test_check_cli_names_an_unknown_kernel_or_mask_without_a_traceback(args, says):
    out = _cli("check", *args)
    assert out.returncode == 2
    assert says in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert out.stdout == ""  # nothing was checked
    if "kernel" in says:
        assert "sdpa_math" in out.stderr.split("known: ")[1] and "flash_attn4" in out.stderr


# FlashAttention-2 and -4 share the `flash_attn` import name; stand-in installs (real importable
# packages on PYTHONPATH, defining only the entry points) check that each adapter asks for its own.
FLASH_INSTALLS = {
    "flash-attn-4": {"flash_attn/__init__.py": "",
                     "flash_attn/cute/__init__.py": "def flash_attn_func(*a, **k): pass\n"},
    "flash-attn": {"flash_attn/__init__.py": "def flash_attn_func(*a, **k): pass\n", "flash_attn_2_cuda.py": ""},
    "flash-attn without its extension": {"flash_attn/__init__.py": "def flash_attn_func(*a, **k): pass\n"},
}


def _kernels_listing(tmp_path, install: str) -> dict[str, str]:
    for path, text in FLASH_INSTALLS[install].items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    out = _cli("kernels", env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[1])])})
    assert out.returncode == 0, out.stderr
    return {line.split()[0]: line for line in out.stdout.splitlines() if line.startswith("flash_attn")}


@NO_CUDA
def test_flash_attn4_alone_makes_only_flash_attn4_available(tmp_path):
    listing = _kernels_listing(tmp_path, "flash-attn-4")
    assert listing["flash_attn4"].split()[2:5] == ["unavailable", "here:", "needs"]  # installed, but no GPU here
    assert "importable" not in listing["flash_attn4"]
    assert "(and flash_attn.flash_attn_func is not importable" in listing["flash_attn2"]
    assert "(and flash_attn_interface is not importable" in listing["flash_attn3"]


@NO_CUDA
def test_flash_attn2_alone_makes_only_flash_attn2_available(tmp_path):
    listing = _kernels_listing(tmp_path, "flash-attn")
    assert "importable" not in listing["flash_attn2"] and "needs CUDA" in listing["flash_attn2"]
    assert "(and flash_attn_interface is not importable" in listing["flash_attn3"]
    assert "(and flash_attn.cute is not importable" in listing["flash_attn4"]


@NO_CUDA
def test_flash_attn2_needs_its_cuda_extension(tmp_path):
    listing = _kernels_listing(tmp_path, "flash-attn without its extension")
    assert "(and flash_attn_2_cuda (the CUDA extension of flash_attn.flash_attn_func)" in listing["flash_attn2"]


def test_the_folder_of_a_loaded_shared_library_is_found():
    """te_fused points TransformerEngine at the cuDNN torch loaded, found in the process's own map."""
    from longca.kernels.transformer_engine_attn import _loaded_library_dir

    libc = _loaded_library_dir("libc.so")
    assert libc and (Path(libc) / "libc.so.6").exists()
    assert _loaded_library_dir("libnothing-longca.so") is None


def test_a_one_shot_backward_can_be_run_again_as_the_harness_times_it():
    """TE's fused attention drops its backward state after one backward; te_fused keeps it so that
    a retained graph's backward runs again (what timing a backward does).  Shown on a function
    that drops its state as TE 2.20 does: its arguments, and the objects its saved tensors are
    rebuilt from (raising AttributeError, as TE does, when those are gone)."""
    from longca.kernels.transformer_engine_attn import TE_BACKWARD_STATE, keep_backward_state

    class OneShot(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.backward_objects = {"scale": 3.0}
            ctx.tensor_objects = ["x"]
            ctx.save_for_backward(x)
            return x * 3.0

        @staticmethod
        def backward(ctx, grad):
            if ctx.tensor_objects is None:
                raise AttributeError("ctx must have .tensor_objects to restore saved tensors")
            ctx.tensor_objects = None
            scale = ctx.backward_objects["scale"]  # fails once the state is gone
            ctx.backward_objects = None
            return grad * scale

    def twice(keep: tuple[str, ...] | None):
        x = torch.ones(4, requires_grad=True)
        out = OneShot.apply(x).view(2, 2)  # a view in between, as TE's reshape
        if keep:
            assert keep_backward_state(out, keep)
        return [torch.autograd.grad(out, x, torch.ones(2, 2), retain_graph=True)[0] for _ in range(2)]

    with pytest.raises(AttributeError, match="tensor_objects"):
        twice(keep=None)
    with pytest.raises(AttributeError, match="tensor_objects"):
        twice(keep=("backward_objects",))       # what te_fused kept before TE 2.20's second drop
    first, second = twice(keep=TE_BACKWARD_STATE)
    assert torch.equal(first, torch.full((4,), 3.0)) and torch.equal(second, first)
    assert not keep_backward_state(torch.ones(2, requires_grad=True) * 2, TE_BACKWARD_STATE)
