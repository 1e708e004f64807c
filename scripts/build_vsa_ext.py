"""Builds VSA's ThunderKittens kernel (fastvideo-kernel's ``csrc/attention/block_sparse_h100.cu``) as
``fastvideo_kernel/_C/fastvideo_kernel_ops`` for sm_90a, without a GPU.

Upstream builds that module with CMake + scikit-build from every source of the package (TurboDiffusion
GEMM/norm/quant kernels, sliding-tile attention, NCCL all-to-all, Blackwell kernels); LongCA calls only
``block_sparse_fwd`` / ``block_sparse_bwd`` (through ``fastvideo_kernel.block_sparse_attn``'s
``block_sparse_attn_sm90``), so this compiles that one file and a binding that exports those two
names, with upstream's flags (CMakeLists.txt's CUDA_FLAGS + -DKITTENS_HOPPER; ThunderKittens' own
setup.py uses the same).  The package's Python looks the other ops up with ``getattr(..., None)``,
so they are simply absent.  ThunderKittens' kernels call the CUDA driver (TMA descriptors): the
module links ``libcuda.so.1`` through a soname-only stub made here (the GPU machine's driver
provides the real one).

    python build_vsa_ext.py SDIST_DIR TK_DIR BUILD_DIR PACKAGE_DIR
      -> PACKAGE_DIR/fastvideo_kernel/_C/fastvideo_kernel_ops.cpython-312-x86_64-linux-gnu.so
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

MODULE = "fastvideo_kernel_ops"

# The two ops of csrc/common_extension.cpp under TK_COMPILE_BLOCK_SPARSE, and nothing else.
BINDING = r'''#include <torch/extension.h>
#include <vector>

std::vector<torch::Tensor> block_sparse_attention_forward(
    torch::Tensor q, torch::Tensor k, torch::Tensor v,
    torch::Tensor q2k_block_sparse_index, torch::Tensor q2k_block_sparse_num, torch::Tensor block_size);
std::vector<torch::Tensor> block_sparse_attention_backward(
    torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor o, torch::Tensor l_vec, torch::Tensor og,
    torch::Tensor k2q_block_sparse_index, torch::Tensor k2q_block_sparse_num, torch::Tensor block_size);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fastvideo-kernel's VSA block-sparse attention (ThunderKittens, sm_90a), built by LongCA";
  m.def("block_sparse_fwd", torch::wrap_pybind_function(block_sparse_attention_forward),
        "block sparse attention forward (Hopper)");
  m.def("block_sparse_bwd", torch::wrap_pybind_function(block_sparse_attention_backward),
        "block sparse attention backward (Hopper)");
}
'''

CUDA_FLAGS = ["-DNDEBUG", "-O3", "-std=c++20", "--use_fast_math", "--expt-extended-lambda",
              "--expt-relaxed-constexpr", "-Xcompiler=-fno-strict-aliasing", "-Xcompiler=-Wno-psabi",
              "-DTORCH_COMPILE", "-DKITTENS_HOPPER", "-gencode=arch=compute_90a,code=sm_90a",
              "-Xptxas=--warn-on-spills"]

# --no-as-needed: the stub defines none of the driver calls, so the linker's default --as-needed would
# drop libcuda.so.1 and the import would fail on cuGetErrorString & co. (seen in the first build).
LINK_CUDA = ["-Wl,--no-as-needed", "-lcuda", "-Wl,--as-needed"]


def cuda_stub(build: Path) -> Path:
    """A soname-only libcuda.so for the link (nothing of it is kept but the DT_NEEDED entry)."""
    stubs = build / "stubs"
    stubs.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stubs / "libcuda.so"),
                    "-x", "c", "-"], input=b"void longca_cuda_stub(void){}\n", check=True)
    return stubs


def main(sdist: Path, tk: Path, build: Path, package: Path) -> Path:
    from torch.utils.cpp_extension import load

    build.mkdir(parents=True, exist_ok=True)
    binding = build / "vsa_binding.cpp"
    if not binding.exists() or binding.read_text() != BINDING:  # unchanged: ninja relinks at most
        binding.write_text(BINDING)
    stubs = cuda_stub(build)
    t0 = time.time()
    try:
        load(name=MODULE, sources=[str(binding), str(sdist / "csrc/attention/block_sparse_h100.cu")],
             build_directory=str(build), verbose=True, is_python_module=True,
             extra_include_paths=[str(tk / "include"), str(tk / "prototype"), str(sdist / "csrc")],
             extra_cflags=["-O3", "-std=c++20"], extra_cuda_cflags=CUDA_FLAGS,
             extra_ldflags=[f"-L{stubs}", *LINK_CUDA])
    except ImportError as exc:  # built; it needs libcuda.so.1, which a machine without a GPU driver lacks
        print("import after build (expected without a GPU driver):", exc, file=sys.stderr)
    dest = package / "fastvideo_kernel" / "_C" / (MODULE + sysconfig.get_config_var("EXT_SUFFIX"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(build / f"{MODULE}.so", dest)
    print(f"{MODULE}: {time.time() - t0:.0f} s -> {dest} ({dest.stat().st_size} bytes)", file=sys.stderr)
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit("usage: build_vsa_ext.py SDIST_DIR TK_DIR BUILD_DIR PACKAGE_DIR")
    main(*(Path(a).resolve() for a in sys.argv[1:]))
