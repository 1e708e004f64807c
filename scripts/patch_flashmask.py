"""Restricts FlashMask V3's PyTorch build to what LongCA measures, in an exported source folder.

The folder is PaddlePaddle/flash-attention's ``flashmask/flash_mask/flashmask_attention_v3`` (its
``setup_torch.py`` builds the extension ``flashmask._C``, which registers ``torch.ops.flashmask``).
Upstream hard-codes the instantiations it builds (bf16 + fp16 off, head dims 64/128/256, forward +
backward, deterministic and not); LongCA measures bf16, head dim 128, forward + backward, never
deterministic, never FlashAttention's own sliding window (FlashMask's masks come as row indices), so
this keeps one forward and two backward files (causal or not) and compiles out local, varlen,
cluster and append-KV, as build_kernels.sh does for FA3.  What is dropped raises at call time.

It also makes the wheel a package: ``flashmask/__init__.py`` + ``flashmask/interface.py`` (upstream's
``interface_torch.py``: ``flashmask_attention(query, key, value, startend_row_indices, causal=...)``)
beside ``flashmask/_C``, instead of a top-level module named ``interface_torch``.

    python patch_flashmask.py SRC_DIR VERSION     (writes SRC_DIR/setup.py and SRC_DIR/flashmask/)

Each edit must match exactly once: a new upstream commit that moved the text fails here, not in a
40-minute compile.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

# Features LongCA never calls, compiled out (setup_torch.py reads these names; the C++ then takes the
# `false` branch of each switch and TORCH_CHECKs the runtime flag).
DISABLED = ("DISABLE_LOCAL", "DISABLE_VARLEN", "DISABLE_CLUSTER", "DISABLE_APPENDKV",
            "DISABLE_HDIMDIFF64", "DISABLE_HDIMDIFF192")

NONDETERMINISTIC = r'''// LongCA build: no deterministic backward instantiations (the *_determ_sm90.cu files are not built).
#define LONGCA_NONDETERMINISTIC(COND, CONST_NAME, ...)                          \
  [&] {                                                                        \
    PADDLE_CHECK(!(COND), " (this FlashMask build has no deterministic backward)"); \
    constexpr static bool CONST_NAME = false;                                  \
    return __VA_ARGS__();                                                      \
  }()
'''

PACKAGE_INIT = '''"""FlashMask V3 through PyTorch (PaddlePaddle/flash-attention, built by LongCA's build_kernels.sh:
bf16, head dim 128, sm_90a, forward + backward).  ``flashmask_attention`` is upstream's
interface_torch.flashmask_attention; ``flashmask._C`` registers ``torch.ops.flashmask.fwd/bwd``."""

from .interface import flashmask_attention

__all__ = ["flashmask_attention"]
'''


def _sub(text: str, old: str, new: str, what: str, regex: bool = False) -> str:
    pattern = old if regex else re.escape(old)
    out, n = re.subn(pattern, lambda _m: new, text)
    if n != 1:
        raise SystemExit(f"patch_flashmask: {what}: expected 1 match, found {n}")
    return out


def patch_setup(text: str, version: str) -> str:
    """setup_torch.py -> setup.py for the restricted build."""
    # upstream's hard-coded choices (after the environment is read): head dim 128 only
    text = _sub(text, r"\nDISABLE_HDIM64 = False[^\n]*", "\nDISABLE_HDIM64 = True  # LongCA", "head dim 64", regex=True)
    text = _sub(text, r"\nDISABLE_HDIM256 = False[^\n]*", "\nDISABLE_HDIM256 = True  # LongCA", "head dim 256", regex=True)
    text = _sub(text, r"\nDISABLE_HDIM128 = False[^\n]*", "\nDISABLE_HDIM128 = False  # LongCA: the one head dim\n"
                + "".join(f"{name} = True  # LongCA\n" for name in DISABLED), "disabled features", regex=True)
    text = _sub(text, 'DETERM_FLAGS = ["", "_determ"]', 'DETERM_FLAGS = [""]', "deterministic backward")
    # Files not named *_sm90.cu (the API, the scheduler) are compiled for sm_80 too upstream.
    text = _sub(text, r"cuda_post_cflags_sm80_sm90 = cuda_post_cflags \+ \\\s*\[\s*'-gencode', 'arch=compute_80,code=sm_80'\]",
                "cuda_post_cflags_sm80_sm90 = cuda_post_cflags", "sm_80 code", regex=True)
    # No git checkout here (CUTLASS is exported beside it).
    text = _sub(text, 'subprocess.run(["git", "submodule", "update", "--init", "cutlass"])', "pass",
                "submodule update")
    text = _sub(text, 'py_modules=["interface_torch"],', "", "top-level module")
    text = _sub(text, 'return "3.0.0b1"', f'return "{version}"', "version")
    return text


def patch_api(text: str) -> str:
    """flash_api_cuda_torch.cu: the backward dispatch never instantiates Deterministic=true."""
    text = _sub(text, "BOOL_SWITCH(params.deterministic, Deterministic,",
                "LONGCA_NONDETERMINISTIC(params.deterministic, Deterministic,", "deterministic switch")
    return _sub(text, "void run_mha_bwd(Flash_bwd_params &params, cudaStream_t stream) {",
                NONDETERMINISTIC + "void run_mha_bwd(Flash_bwd_params &params, cudaStream_t stream) {",
                "run_mha_bwd")


def main(src: Path, version: str) -> None:
    (src / "setup.py").write_text(patch_setup((src / "setup_torch.py").read_text(), version))
    api = src / "flash_api_cuda_torch.cu"
    api.write_text(patch_api(api.read_text()))
    pkg = src / "flashmask"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text(PACKAGE_INIT)
    shutil.copy2(src / "interface_torch.py", pkg / "interface.py")
    print(f"patched {src}: bf16, head dim 128, fwd + bwd (not deterministic), sm_90a; version {version}",
          file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: patch_flashmask.py SRC_DIR VERSION")
    main(Path(sys.argv[1]), sys.argv[2])
