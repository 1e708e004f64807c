#!/usr/bin/env bash
# Builds the optional Hopper attention kernels for a GPU machine with torch 2.11.0+cu130 and Python 3.12
# but no compiler or network, where no wheel exists for that torch, and packs them for copying over.
# On a normal machine you would not need this: `pip install flash-attn` (FA2), build FA3 from
# flash-attention's hopper/ directory, `pip install transformer_engine[pytorch]`.
#
#   bash scripts/build_kernels.sh OUT_DIR [fa2] [te] [fa3]      (default: all three)
#   bash scripts/build_kernels.sh OUT_DIR pack                  (only re-pack OUT_DIR/wheels)
#   OUT_REL=.gpu-bundles/ffa bash scripts/build_kernels.sh .gpu-bundles/ffa ffa   (MagiAttention FFA: own OUT_DIR)
#   bash scripts/build_kernels.sh OUT_DIR flashmask vsa_cuda    (FlashMask V3's torch binding, VSA's CUDA kernel)
#   bash scripts/build_kernels.sh OUT_DIR LIBRARY... --dry-run  (what each would be built from and into; nothing done)
#
# Needs: Linux x86_64, a Python 3.12 (python3.12 on PATH, pyenv, or PY312=/path/to/python3.12), gcc,
# git, xz, network to PyPI (and github.com for fa3, unless FA3_GIT_DIR/CUTLASS_GIT_DIR name local
# git dirs holding the pinned commits).  No GPU is needed.  Scratch space (~12 GB: build venv with
# torch + CUDA 13.0 wheels, sources, build trees) is $KERNEL_BUILD_DIR (default $OUT_DIR/build).
#
# Output: OUT_DIR/wheels/*.whl, OUT_DIR/part1..partN (each <= PART_BYTES, 40 MB: wheels, or pieces of a bigger
# wheel) and OUT_DIR/install_kernels.sh (copied into every part) + OUT_DIR/INSTALL.txt.
# On the GPU machine, once per part:  bash partK/install_kernels.sh partK [/tmp/site]
#
# What is built (all restricted to what LongCA benchmarks: head dim 128, bf16, forward + backward,
# causal / sliding window / varlen; anything else raises at call time):
#   fa2  flash-attn 2.8.3 (PyPI sdist), module flash_attn + extension flash_attn_2_cuda; sm_80 + sm_90
#        SASS; hdim 128 + bf16 only (static_switch.h), dropout/ALiBi/softcap/uneven-K compiled out;
#        flash_attn/cute (and hopper/) dropped: FlashAttention-4 owns flash_attn/cute.   8 min here
#        (FA2_ARCHS="80": 10 min with the TE build running beside it)
#   te   transformer_engine_torch 2.20.2 (PyPI sdist; a C++-only torch extension) built against the
#        prebuilt core wheel transformer_engine_cu13 2.20.2 and the transformer_engine 2.20.2
#        metapackage, + pydantic (the GPU machine lacked it); NCCL EP off.  The core wheel (277 MB:
#        SASS for sm_75 ... sm_120) is shrunk to its sm_90 device code by scripts/keep_cuda_arch.py
#        (other SMs' cubins zeroed in place: 32 MB); TE_ALL_ARCHS=1 keeps it whole.
#        18 min here (33 C++ files; the FA3 build ran beside it)
#   fa3  FlashAttention-3 (flash-attention hopper/ at FA3_COMMIT, CUTLASS at the submodule commit),
#        modules flash_attn_interface + flash_attn_3._C; sm_90a; bf16 and fp8 e4m3 (forward only: FA3 has
#        no fp8 backward), hdim 128, no fp16/split/paged/appendkv/softcap/packgqa/cluster/sm80; local,
#        varlen, backward (its deterministic variant is a run-time switch of the same kernels) kept.
#        8 min here (4 files; beside the TE build) without fp8; with it 4 min, nothing beside it
#        (flash_fwd_hdim128_{bf16,e4m3}_sm90.cu, flash_bwd_hdim128_bf16_sm90.cu; 2026-11-29)
#   ffa  MagiAttention (MAGI_COMMIT, CUTLASS at its csrc/cutlass submodule commit), module magi_attention:
#        flex_flash_attn_func's kernels are JIT-built at first call unless magi_attention/lib/<uri>/<uri>.so
#        exists (JitSpec.build_and_load checks that AOT dir first): the two variants that a default call
#        with bf16 q/k/v, head dim 128 asks for (fwd: out fp32, atomic, 128x128 tiles; bwd: dq/dk/dv fp32,
#        atomic) and their non-atomic twins (MagiAttention's distributed attention, LongCA's `magi` CP
#        strategy, asks for those where ranges do not overlap) are compiled there for sm_90a (JIT flags,
#        via MagiAttention's own JitSpec), + magi_attn_ext
#        (upstream CMake; here torch cpp_extension, same sources and flags, sm_90, + -fopenmp).  The
#        forward mainloop's lambdas are marked always_inline (inline_lambdas says why).  No
#        magi_attn_comm (NVSHMEM group collectives, only for distributed attention).  Packed as a wheel
#        (no csrc/cutlass: any other variant would need nvcc at first use and fails), + einops, debugpy,
#        packaging.  18 min here, MAX_JOBS=1 and nothing beside it (magi_attn_ext 7 files 6.5 min; FFA
#        3 common files + fwd 6 min, bwd 2.5 min); MAGI_GIT_DIR / CUTLASS_GIT_DIR: local git dirs.
#        Also the two auto_range_merge variants (fwd + bwd) that LongCA's ffa_block_sparse asks for.
#   flashmask  FlashMask V3's PyTorch binding (PaddlePaddle/flash-attention flashmask_attention_v3 at
#        FLASHMASK_COMMIT, setup_torch.py; CUTLASS at its submodule commit, v3.8.0): package flashmask
#        (flashmask_attention = upstream's interface_torch) + extension flashmask._C (torch.ops.flashmask);
#        sm_90a, bf16, hdim 128, forward + backward (causal and not); scripts/patch_flashmask.py drops
#        hdim 64/256, the deterministic backward, local/varlen/cluster/append-KV and the API's sm_80 code
#        (upstream already drops fp16/fp8/sm80/split/paged/softcap/packgqa).  5 compiled files.
#        29 min here (MAX_JOBS=2, beside the vsa_cuda build and other workers' test runs, load 7-9;
#        2026-11-29); FLASHMASK_INLINE_BWD=1: the backward's lambdas inlined (build_flashmask says why;
#        recompiling the two backward files for it took 6 min on an idle machine).  FLASHMASK_GIT_DIR.
#   vsa_cuda  fastvideo-kernel's package + fastvideo_kernel/_C/fastvideo_kernel_ops with only
#        block_sparse_fwd/bwd: csrc/attention/block_sparse_h100.cu (PyPI sdist) + ThunderKittens at
#        TK_COMMIT (the sdist lacks its include/tk submodule), upstream's flags + -DKITTENS_HOPPER, sm_90a,
#        by scripts/build_vsa_ext.py; libcuda.so.1 through a soname-only stub.  One wheel (cp312) that
#        replaces `vsa`'s.  23 min here (MAX_JOBS=1, beside the flashmask build; 2026-11-29); a relink
#        alone 1 min ($WORK/vsa-ext keeps the objects).  TK_GIT_DIR: a local git dir.
#   vsa  fastvideo-kernel (FastVideo's Video Sparse Attention, VSA_VERSION): its Python package packed as
#        a wheel from the PyPI sdist, without its CUDA extension, for LongCA's vsa_triton (Triton
#        kernels, compiled on the GPU at first call) + einops.  Seconds.
#   flashinfer  FlashInfer (FLASHINFER_VERSION, PyPI wheel) for LongCA's flashinfer_block_sparse: its
#        kernels are tvm-ffi modules (no libpython/libtorch link) JIT-built at first use unless
#        flashinfer/data/aot/<uri>/<uri>.so exists (JitSpecNvcc.try_load looks there first).  The one
#        module VariableBlockSparseAttentionWrapper asks for on Hopper (batch prefill, FA3 backend, bf16,
#        head dim 128, int32 indices; group size and causal are run-time arguments) is compiled there for
#        sm_90a by FlashInfer's own JitSpec, against a soname-only libcuda stub (the module does not
#        keep it).  The package is packed without what `import flashinfer` and this path never load
#        (JIT headers and CUTLASS/CCCL, most of flashinfer/experimental, moe_ep; the top-level csrc
#        templates stay: FlashInfer regenerates its sources before the lookup) as a tar.xz beside the
#        apache-tvm-ffi wheel (5.7 + 3.3 MB); install_kernels.sh unpacks it into the same TARGET.  11 min here
#        (one module, MAX_JOBS=1; 2026-11-27).
# Times: this container (2 cores, 24 GB; nice 19, MAX_JOBS=2), 2026-11-25, sources and toolchain
# already downloaded; the first run also downloads ~4 GB (torch 2.11.0 + CUDA 13.0 wheels).
set -euo pipefail
OUT=${1:?usage: build_kernels.sh OUT_DIR [LIBRARY...] [--dry-run]}; shift || true
DRY_RUN=; NAMED=()
for arg in "$@"; do if [ "$arg" = --dry-run ]; then DRY_RUN=1; else NAMED+=("$arg"); fi; done
LIBS=${NAMED[*]:-fa2 te fa3}
KNOWN="fa2 te fa3 ffa flashmask vsa vsa_cuda flashinfer pack"
# Every name is checked before anything is downloaded or built (the toolchain alone is ~4 GB).
for lib in $LIBS; do
  case " $KNOWN " in *" $lib "*) ;; *) echo "unknown library $lib (${KNOWN// /, })" >&2; exit 2 ;; esac
done
[ -n "$DRY_RUN" ] || { mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd); }
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=${KERNEL_BUILD_DIR:-$OUT/build}
export MAX_JOBS=${MAX_JOBS:-2}
NICE="nice -n 19"
# Parts for copying: 40 MB each by default; PART_BYTES sets another size (the GPU machine took at most
# 64 MiB at a time, the repository's own files included).
PART_BYTES=${PART_BYTES:-40000000}

# ---- pins ------------------------------------------------------------------------------------------
TORCH_VERSION=2.11.0            # PyPI's manylinux_2_28 wheel is 2.11.0+cu130
CUDA_TOOLKIT=13.0.2             # metapackage pinning nvcc/crt/nvvm 13.0.88, cudart 13.0.96, cccl 13.0.85,
                                # cublas 13.1.0.3, cusparse 12.6.3.3, cusolver 12.0.4.66, curand 10.4.0.35,
                                # nvtx 13.0.85 ... (the set torch 2.11.0 itself requires)
CUDNN=9.19.0.56                 # = torch 2.11.0's pin, = the GPU machine's cuDNN 9.19
NCCL=2.28.9 CUFILE=1.15.1.6 CUSPARSELT=0.8.0 NVSHMEM=3.4.5   # only so `import torch` works here
FA2_VERSION=2.8.3
FA2_ARCHS=${FA2_ARCHS:-"80;90"}  # sm_80 + sm_90 SASS, like the official wheels ("80" alone: half the time)
TE_VERSION=2.20.2
# `import transformer_engine.pytorch` needs pydantic (transformer_engine/common/recipe), which the GPU
# machine lacked; onnx/onnxscript/onnx-ir/ml-dtypes/einops/numpy/protobuf/typing-extensions were there,
# nvdlfw-inspect is imported only by TE's debug features, nvidia-cudnn-frontend is LongCA's cudnn_fe
# extra (pyproject.toml).  pydantic 2.11 needs only typing-extensions>=4.12.2.
TE_PY_DEPS="pydantic==2.11.10 pydantic-core==2.33.2 annotated-types==0.7.0 typing-inspection==0.4.1"
FA3_COMMIT=0251105a2fb19d2957484b7f023cd8c115286ced       # flash-attention main, 2026-08-15 (FA3 3.0.0)
CUTLASS_COMMIT=7127592069c2fe01b041e174ba4345ef9b279671   # its csrc/cutlass submodule (v4.3.0-48)
MAGI_COMMIT=2c6413571c2cac6a80d1f85a434c6713fe0f5286      # MagiAttention main, 2026-05-28
MAGI_CUTLASS_COMMIT=81a43e6d92cdd8c20d22392f9579604ed5f710a1   # its magi_attention/csrc/cutlass submodule
MAGI_VERSION=1.1.1+g2c64135     # versioningit's default-version + commit (no git work tree here)
FLASHMASK_COMMIT=9985af538d20bd7a56c7a5f5ea13294d454a011a  # PaddlePaddle/flash-attention main, 2026-08-17
FLASHMASK_CUTLASS_COMMIT=afa1772203677c5118fcd82537a9c8fefbcc7008  # its flashmask_attention_v3/cutlass submodule (v3.8.0)
FLASHMASK_VERSION=3.0.0b1+g9985af5   # setup_torch.py's version + commit
VSA_VERSION=0.3.5               # fastvideo-kernel (FastVideo's VSA): its Python package, Triton kernels only
TK_COMMIT=6c27e28c8115d1839d9eeeb530913c184a75fc87   # ThunderKittens: FastVideo's fastvideo-kernel/include/tk submodule
                                # (unchanged from 2025-12-26 to 2026-08-21, the 0.3.x releases)
FLASHINFER_VERSION=0.7.2.post1  # flashinfer-python (its wheel: Python + JIT sources)
TVM_FFI_VERSION=0.1.15.post2    # apache-tvm-ffi, FlashInfer's module ABI (cp312 wheel)
# What `import flashinfer` needs besides torch, and the GPU machine had: requests, nvidia-ml-py, tqdm,
# click, tabulate, einops, packaging, ninja; here only to import it while building.
FLASHINFER_BUILD_DEPS="requests nvidia-ml-py tqdm click tabulate einops"
FFA_PY_DEPS="einops==0.8.2 debugpy==1.8.22 packaging==26.4"   # imported by magi_attention at import time
                                # (+ torch, jinja2, filelock, numpy, triton: there with torch 2.11)
FA3_FLAGS="BACKWARD=FALSE SM80=TRUE FP16=TRUE FP8=FALSE HDIM64=TRUE HDIM96=TRUE HDIM192=TRUE HDIM256=TRUE
  HDIMDIFF64=TRUE HDIMDIFF192=TRUE SPLIT=TRUE PAGEDKV=TRUE APPENDKV=TRUE SOFTCAP=TRUE PACKGQA=TRUE
  CLUSTER=TRUE LOCAL=FALSE VARLEN=FALSE"                  # -> FLASH_ATTENTION_DISABLE_<X>=<value>

V=$WORK/venv; PY=$V/bin/python; PIP="$V/bin/pip --disable-pip-version-check"
SITE=$WORK/venv/lib/python3.12/site-packages
CUDA=$SITE/nvidia/cu13          # the pip CUDA 13.0 toolkit, completed below into a CUDA_HOME layout
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

find_py312() {
  [ -n "${PY312:-}" ] && { echo "$PY312"; return; }
  command -v python3.12 >/dev/null 2>&1 && python3.12 -V >/dev/null 2>&1 && { command -v python3.12; return; }
  command -v pyenv >/dev/null && ls -d "$(pyenv root)"/versions/3.12*/bin/python3.12 2>/dev/null | tail -1 && return
  command -v uv >/dev/null && uv python find 3.12 && return
  echo "no Python 3.12 found (set PY312)" >&2; return 1
}

toolchain() {
  if [ ! -x "$PY" ]; then
    log "build venv $V"
    "$(find_py312)" -m venv "$V"
    $PIP install -q -U pip wheel "setuptools<82" ninja packaging psutil
    $PIP install -q --no-deps "torch==$TORCH_VERSION"
    $PIP install -q filelock "typing-extensions>=4.10" sympy networkx jinja2 fsspec numpy \
      "cuda-toolkit[nvcc,cudart,cccl,crt,nvvm,cublas,cusparse,cusolver,curand,nvtx,nvrtc,nvjitlink,cupti,cufft]==$CUDA_TOOLKIT" \
      "nvidia-cudnn-cu13==$CUDNN" "nvidia-nccl-cu13==$NCCL"
    $PIP install -q --no-deps "nvidia-cufile==$CUFILE" "nvidia-cusparselt-cu13==$CUSPARSELT" \
      "nvidia-nvshmem-cu13==$NVSHMEM"
  fi
  # CUDA_HOME = the cu13 folder (bin/nvcc, nvvm/, include/, lib/) + lib64, unversioned .so names,
  # and the cuDNN / NCCL headers TE's extension includes from $CUDA_HOME/include.
  ( cd "$CUDA" && ln -sfn lib lib64
    for f in lib/*.so.*; do b=$(basename "$f"); [ -e "lib/${b%%.so.*}.so" ] || ln -s "$b" "lib/${b%%.so.*}.so"; done
    for h in "$SITE"/nvidia/cudnn/include/*.h "$SITE"/nvidia/nccl/include/*.h; do ln -sfn "$h" include/; done )
  export CUDA_HOME=$CUDA PATH=$CUDA/bin:$PATH
  "$PY" -c "import torch; assert torch.__version__ == '$TORCH_VERSION+cu130', torch.__version__"
  nvcc --version | grep -q "release 13.0" || { echo "nvcc is not 13.0" >&2; exit 1; }
}

# ---- FlashAttention-2 ------------------------------------------------------------------------------
patch_fa2() {  # $1: unpacked sdist
  "$PY" - "$1" <<'EOF'
import re, sys, pathlib, shutil
root = pathlib.Path(sys.argv[1])
# dispatch: only bf16 / head dim 128, so flash_api.cpp references only the compiled instantiations
sw = root / "csrc/flash_attn/src/static_switch.h"
s = sw.read_text()
sw.write_text(s[: s.index("#define FP16_SWITCH")] + r'''#define FP16_SWITCH(COND, ...)                                                   \
  [&] {                                                                          \
    TORCH_CHECK(!(COND), "this flash-attn build has bf16 kernels only");         \
    using elem_type = cutlass::bfloat16_t;                                       \
    return __VA_ARGS__();                                                        \
  }()

#define HEADDIM_SWITCH(HEADDIM, ...)                                             \
  [&] {                                                                          \
    TORCH_CHECK(HEADDIM > 96 && HEADDIM <= 128,                                  \
                "this flash-attn build has head dim 128 kernels only");          \
    constexpr static int kHeadDim = 128;                                         \
    return __VA_ARGS__();                                                        \
  }()
''')
# sources: flash_api.cpp + the six hdim128 bf16 files (fwd, split-kv fwd, bwd; causal and not).
# mha_fwd picks split-kv by a heuristic (num_splits=0), so the split files are needed.
sp = root / "setup.py"
t = sp.read_text()
keep = ["csrc/flash_attn/flash_api.cpp"] + [f"csrc/flash_attn/src/flash_{k}_hdim128_bf16{c}_sm80.cu"
                                             for k in ("fwd", "fwd_split", "bwd") for c in ("", "_causal")]
t, n = re.subn(r'sources=\[\s*"csrc/flash_attn/flash_api.cpp",.*?\],', "sources=" + repr(keep) + ",",
               t, count=1, flags=re.S)
assert n == 1, "sources list not found"
# compile out dropout, ALiBi, softcap and head dims that are not a multiple of 32
flags = ('["-DFLASHATTENTION_DISABLE_DROPOUT", "-DFLASHATTENTION_DISABLE_ALIBI", '
         '"-DFLASHATTENTION_DISABLE_SOFTCAP", "-DFLASHATTENTION_DISABLE_UNEVEN_K"]')
t = t.replace('"cxx": compiler_c17_flag,', f'"cxx": compiler_c17_flag + {flags},', 1)
t = t.replace('"nvcc": append_nvcc_threads(nvcc_flags + cc_flag),',
              f'"nvcc": append_nvcc_threads(nvcc_flags + cc_flag + {flags}),', 1)
assert t.count('"-DFLASHATTENTION_DISABLE_DROPOUT", ') == 2
# do not ship flash_attn/cute (FlashAttention-4's wheel owns it there) nor the sdist's hopper/ (FA3 sources)
t = t.replace('"flash_attn.egg-info",', '"flash_attn.egg-info", "flash_attn.cute", "flash_attn.cute.*", "hopper", "hopper.*",', 1)
sp.write_text(t)
shutil.rmtree(root / "flash_attn/cute", ignore_errors=True)
# flash_attn/__init__.py: a broken or missing FA2 extension must not make flash_attn.cute (FA4,
# installed into the same flash_attn/ folder or another sys.path entry) unimportable.
ini = root / "flash_attn/__init__.py"
i = ini.read_text()
head, imports = i.split("\n\nfrom flash_attn.flash_attn_interface import", 1)
ini.write_text(head + '''

# FlashAttention-4 (flash-attn-4) installs flash_attn/cute/ without a flash_attn/__init__.py: keep it
# reachable from another sys.path entry too.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

try:
    from flash_attn.flash_attn_interface import''' + imports.rstrip().replace("\n", "\n    ") + '''
except ImportError as _exc:  # e.g. flash_attn_2_cuda does not load: flash_attn.cute still imports
    _fa2_import_error = _exc
''')
print("patched", root)
EOF
}

build_fa2() {
  local d=$WORK/fa2 t0=$SECONDS
  rm -rf "$d" && mkdir -p "$d"
  $PIP download -q --no-deps --no-binary :all: --no-build-isolation "flash-attn==$FA2_VERSION" -d "$d"
  tar xzf "$d/flash_attn-$FA2_VERSION.tar.gz" -C "$d"
  patch_fa2 "$d/flash_attn-$FA2_VERSION"
  ( cd "$d/flash_attn-$FA2_VERSION" &&
    FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS="$FA2_ARCHS" NVCC_THREADS=1 \
      $NICE $PIP wheel -v --no-build-isolation --no-deps -w "$OUT/wheels" . > "$d/build.log" 2>&1 ) ||
    { tail -40 "$d/build.log"; exit 1; }
  log "fa2 built in $(( (SECONDS - t0) / 60 )) min"
}

# ---- TransformerEngine -----------------------------------------------------------------------------
build_te() {
  local d=$WORK/te t0=$SECONDS
  rm -rf "$d" && mkdir -p "$d"
  # prebuilt pieces: the core library (CUDA 13) and the metapackage
  $PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$OUT/wheels" "transformer-engine==$TE_VERSION" $TE_PY_DEPS
  $PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
    -d "$d/core" "transformer-engine-cu13==$TE_VERSION"
  if [ -n "${TE_ALL_ARCHS:-}" ]; then cp "$d"/core/*.whl "$OUT/wheels/"
  else "$PY" "$HERE/keep_cuda_arch.py" "$d"/core/*.whl "$OUT/wheels" --sm 90; fi
  $PIP download -q --no-deps --no-binary :all: --no-build-isolation "transformer-engine-torch==$TE_VERSION" -d "$d"
  tar xzf "$d/transformer_engine_torch-$TE_VERSION.tar.gz" -C "$d"
  # NVTE_NO_LOCAL_VERSION: the version must be exactly $TE_VERSION (TE checks core == torch ext == meta)
  ( cd "$d/transformer_engine_torch-$TE_VERSION" &&
    NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_NO_LOCAL_VERSION=1 NVTE_WITH_NCCL_EP=0 NVTE_CUDA_ARCHS=90 \
      $NICE $PIP wheel -v --no-build-isolation --no-deps -w "$OUT/wheels" . > "$d/build.log" 2>&1 ) ||
    { tail -40 "$d/build.log"; exit 1; }
  log "te built in $(( (SECONDS - t0) / 60 )) min"
}

# ---- FlashAttention-3 ------------------------------------------------------------------------------
# A local git dir that lacks blobs outside the exported paths (a partial mirror) makes `git archive`
# print "invalid object ..." for them; it still exits 0 with the named paths complete.
git_export() {  # $1 url, $2 commit, $3 local git dir (may be empty), $4 dest, $5.. paths
  local url=$1 commit=$2 gd=$3 dest=$4; shift 4
  if [ -z "$gd" ]; then   # owner+name: Dao-AILab's and PaddlePaddle's flash-attention are different clones
    gd=$WORK/git/$(basename "$(dirname "$url")")+$(basename "$url" .git).git
    [ -d "$gd" ] || git clone -q --bare --filter=blob:none "$url" "$gd"
    git --git-dir="$gd" cat-file -e "$commit" 2>/dev/null || git --git-dir="$gd" fetch -q origin "$commit"
  fi
  mkdir -p "$dest" && git --git-dir="$gd" archive "$commit" "$@" | tar x -C "$dest"
}

build_fa3() {
  local d=$WORK/fa3 t0=$SECONDS
  rm -rf "$d" && mkdir -p "$d"
  git_export https://github.com/Dao-AILab/flash-attention "$FA3_COMMIT" "${FA3_GIT_DIR:-}" "$d" hopper README.md LICENSE
  git_export https://github.com/NVIDIA/cutlass "$CUTLASS_COMMIT" "${CUTLASS_GIT_DIR:-}" "$d/csrc/cutlass" include
  local env=() kv
  for kv in $FA3_FLAGS; do env+=("FLASH_ATTENTION_DISABLE_$kv"); done
  ( cd "$d/hopper" &&
    env "${env[@]}" FLASH_ATTENTION_FORCE_BUILD=TRUE TORCH_CUDA_ARCH_LIST=9.0a NVCC_THREADS=1 \
      $NICE $PIP wheel -v --no-build-isolation --no-deps -w "$OUT/wheels" . > "$d/build.log" 2>&1 ) ||
    { tail -40 "$d/build.log"; exit 1; }
  log "fa3 built in $(( (SECONDS - t0) / 60 )) min"
}

# ---- FlashMask V3, its PyTorch binding ----------------------------------------------------------------
# PaddlePaddle/flash-attention's flashmask_attention_v3 with setup_torch.py: module flashmask._C
# (torch.ops.flashmask.fwd/bwd), restricted by scripts/patch_flashmask.py (bf16, head dim 128, fwd + bwd).
build_flashmask() {
  local d=$WORK/flashmask t0=$SECONDS s
  rm -rf "$d" && mkdir -p "$d"
  git_export https://github.com/PaddlePaddle/flash-attention "$FLASHMASK_COMMIT" "${FLASHMASK_GIT_DIR:-}" "$d/src" \
    flashmask/flash_mask/flashmask_attention_v3 LICENSE
  s=$d/src/flashmask/flash_mask/flashmask_attention_v3
  git_export https://github.com/NVIDIA/cutlass "$FLASHMASK_CUTLASS_COMMIT" "${CUTLASS_GIT_DIR:-}" "$s/cutlass" include
  "$PY" "$HERE/patch_flashmask.py" "$s" "$FLASHMASK_VERSION"
  # CUDA 13.0 leaves the backward mainloop's bwd_step lambda a called function in most of its variants
  # (ptxas: 12 C7510/C7520 "wgmma serialized" warnings, 1088-1104-byte stack frames in 12 functions),
  # as it did FFA's forward.  Marking the lambdas always_inline (FLASHMASK_INLINE_BWD=1) removes the
  # C7519/C7520 and the 1 KB frames but gives 8 C7510 and 8 functions with 560-576-byte frames: which
  # runs faster is for a GPU to say, so the default build keeps upstream's code.  The forward has none.
  [ -z "${FLASHMASK_INLINE_BWD:-}" ] || inline_lambdas "$s/mainloop_bwd_sm90_tma_gmma_ws.hpp"
  cp "$d/src/LICENSE" "$s/"
  ( cd "$s" &&
    FLASH_MASK_V3_FORCE_BUILD=TRUE TORCH_CUDA_ARCH_LIST=9.0a NVCC_THREADS=1 \
      $NICE $PIP wheel -v --no-build-isolation --no-deps -w "$OUT/wheels" . > "$d/build.log" 2>&1 ) ||
    { tail -40 "$d/build.log"; exit 1; }
  log "flashmask built in $(( (SECONDS - t0) / 60 )) min"
}

# ---- MagiAttention FFA ------------------------------------------------------------------------------
write_ffa_tools() {  # $1: dir for ffa_aot.py and build_ext.py
  cat > "$1/ffa_aot.py" <<'EOF'
# Render + compile FFA JIT variants into magi_attention/lib/<uri>/<uri>.so (the AOT dir that
# JitSpec.build_and_load loads before it would compile), with MagiAttention's own JitSpec and flags.
# No GPU needed; magi_attn_ext is stubbed (used only in profile mode).  usage: ffa_aot.py SRC VARIANT...
import sys, types, shutil, pathlib, time
src = pathlib.Path(sys.argv[1]).resolve()
def stub(name, path=None):
    m = types.ModuleType(name)
    if path is not None: m.__path__ = [str(path)]
    sys.modules[name] = m; return m
pkg = src / "magi_attention"   # package stubs: skip magi_attention/__init__.py (needs magi_attn_ext)
stub("magi_attention", pkg); stub("magi_attention.common", pkg / "common"); stub("magi_attention.functional", pkg / "functional")
sys.modules["magi_attention"].magi_attn_ext = stub("magi_attention.magi_attn_ext")
import torch
from magi_attention.common.jit import env as jit_env
from magi_attention.functional import _flex_flash_attn_jit as J
bf16, f32 = torch.bfloat16, torch.float32
# what flex_flash_attn_func(q, k, v, q_ranges, k_ranges, attn_type_map) with default flags asks for
cfg = {"fwd": dict(direction="fwd", head_dim=128, compute_dtype=bf16, output_dtype=f32, softcap=False,
                   disable_atomic_reduction=False, deterministic=False),
       "bwd": dict(direction="bwd", head_dim=128, compute_dtype=bf16, output_dtype=None, softcap=False,
                   disable_atomic_reduction=False, deterministic=False, dq_dtype=f32, dkv_dtype=f32)}
# what MagiAttention's distributed attention (LongCA's `magi` CP strategy) asks for besides: a stage whose
# query (key) ranges do not overlap writes its output (dK/dV) without atomics, still in float32
cfg["fwd_plain"] = {**cfg["fwd"], "disable_atomic_reduction": True}
cfg["bwd_plain"] = {**cfg["bwd"], "disable_atomic_reduction": True}
# what LongCA's ffa_block_sparse asks for: each query range's key ranges merged into one work item
# (auto_range_merge, as block-sparse callers of FFA use it)
cfg["fwd_arm"] = {**cfg["fwd"], "auto_range_merge": True}
cfg["bwd_arm"] = {**cfg["bwd"], "auto_range_merge": True}
for d in sys.argv[2:]:
    spec, uri = J.get_ffa_jit_spec(arch=(9, 0), **cfg[d])
    t0 = time.time(); spec.build()
    so = spec.workspace_path / f"{uri}.so"; out = jit_env.MAGI_ATTENTION_AOT_DIR / uri
    out.mkdir(parents=True, exist_ok=True); shutil.copy2(so, out / so.name)
    print(f"{uri}: {time.time() - t0:.0f} s, {so.stat().st_size} bytes", flush=True)
EOF
  cat > "$1/build_ext.py" <<'EOF'
# magi_attn_ext: upstream builds it with CMake (csrc/extensions/CMakeLists.txt); here torch's
# cpp_extension with the same sources and flags, + -fopenmp (dyn_solver_alg.cpp; torch brings libgomp).
# usage: build_ext.py SRC BUILD_DIR -> SRC/magi_attention/magi_attn_ext.cpython-312-x86_64-linux-gnu.so
import sys, glob, shutil, sysconfig, time, pathlib
from torch.utils.cpp_extension import load
src = pathlib.Path(sys.argv[1]).resolve(); bd = pathlib.Path(sys.argv[2]).resolve(); bd.mkdir(parents=True, exist_ok=True)
ext = src / "magi_attention/csrc/extensions"; t0 = time.time()
try:
    load(name="magi_attn_ext", sources=sorted(glob.glob(f"{ext}/*.cpp") + glob.glob(f"{ext}/*.cu")),
         build_directory=str(bd), verbose=True, is_python_module=True,
         extra_include_paths=[str(ext), str(src / "magi_attention/csrc/common")],
         extra_cflags=["-O3", "-Wno-unused-variable", "-std=c++17", "-fopenmp"],
         extra_cuda_cflags=["-O3", "--use_fast_math", "-lineinfo", "-DNDEBUG", "-std=c++17"],
         extra_ldflags=["-fopenmp"])
except ImportError as e:  # built, but may not import here
    print("import after build:", e)
dst = src / "magi_attention" / ("magi_attn_ext" + sysconfig.get_config_var("EXT_SUFFIX"))
shutil.copy2(bd / "magi_attn_ext.so", dst); print(f"magi_attn_ext: {time.time() - t0:.0f} s -> {dst}")
EOF
}

# CUDA 13's front end leaves some of the lambdas of FFA's forward mainloop (fwd_step and the ones
# around it) as called functions; the scores then live on the stack and ptxas waits for every
# tensor-core instruction (C7519 "warpgroup.arrive is injected"): 96 of 96 HGMMA waited on, a
# 960-byte stack, 35-43 TFLOPs/s on an H200 (docs/results/README.md).  Marking every lambda of that
# file always_inline gives 12 waits for 96 HGMMA and 16 bytes of stack (cuobjdump -sass), as FA3's
# forward has.  Nothing else changes: the same code, inlined.  The backward kernel is not affected.
inline_lambdas() {  # $1: a mainloop header (FFA's forward; FlashMask's backward with FLASHMASK_INLINE_BWD=1)
  "$PY" - "$1" <<'EOF'
import re, sys
path = sys.argv[1]
text = open(path).read()
# `[&] {`, `[&]() {`, `[&](args) {` (args may hold one level of parentheses)
lambda_head = re.compile(r"\[&\]\s*(\([^()]*(?:\([^()]*\)[^()]*)*\))?\s*\{")
text, n = lambda_head.subn(lambda m: f"[&]{m.group(1) or '()'} __attribute__((always_inline)) {{", text)
assert n > 0, f"no lambda found in {path}"
open(path, "w").write(text)
print(f"{path}: {n} lambdas marked always_inline", file=sys.stderr)
EOF
}

build_ffa() {
  local d=$WORK/ffa t0=$SECONDS s
  rm -rf "$d" && mkdir -p "$d/tools"
  git_export https://github.com/SandAI-org/MagiAttention "$MAGI_COMMIT" "${MAGI_GIT_DIR:-}" "$d/src" magi_attention LICENSE
  git_export https://github.com/NVIDIA/cutlass "$MAGI_CUTLASS_COMMIT" "${CUTLASS_GIT_DIR:-}" \
    "$d/src/magi_attention/csrc/cutlass" include tools/util/include
  write_ffa_tools "$d/tools"
  s=$d/src
  inline_lambdas "$s/magi_attention/csrc/flexible_flash_attention/mainloop_fwd_sm90_tma_gmma_ws.hpp"
  ( cd "$d" &&
    TORCH_CUDA_ARCH_LIST=9.0 $NICE "$PY" tools/build_ext.py "$s" "$d/ext-build" > "$d/build_ext.log" 2>&1 &&
    TORCH_CUDA_ARCH_LIST=9.0a NVCC_THREADS=1 MAGI_ATTENTION_WORKSPACE_BASE=$d/ws \
      $NICE "$PY" tools/ffa_aot.py "$s" fwd bwd fwd_plain bwd_plain fwd_arm bwd_arm > "$d/build.log" 2>&1 ) ||
    { tail -40 "$d/build_ext.log" "$d/build.log" 2>/dev/null; exit 1; }
  # wheel: the Python package + magi_attn_ext + lib/<uri>/<uri>.so + the jinja templates (read at every
  # call); without CUTLASS, grpcoll sources and the upstream CMake build folder
  local w=$d/wheel di=$d/wheel/magi_attention-$MAGI_VERSION.dist-info
  rm -rf "$w" && mkdir -p "$di"
  cp -r "$s/magi_attention" "$w/"
  rm -rf "$w/magi_attention/csrc/cutlass" "$w/magi_attention/csrc/comm" "$w/magi_attention/functional/flash-attention"
  find "$w" -name __pycache__ -prune -exec rm -rf {} +
  echo "__version__ = \"$MAGI_VERSION\"" > "$w/magi_attention/_version.py"
  cp "$s/LICENSE" "$di/"
  printf 'Metadata-Version: 2.1\nName: magi_attention\nVersion: %s\nSummary: MagiAttention %s, FFA prebuilt for sm_90a bf16 hdim 128 (LongCA build_kernels.sh)\nRequires-Python: >=3.10\n' \
    "$MAGI_VERSION" "$MAGI_COMMIT" > "$di/METADATA"
  printf 'Wheel-Version: 1.0\nGenerator: build_kernels.sh\nRoot-Is-Purelib: false\nTag: cp312-cp312-linux_x86_64\n' > "$di/WHEEL"
  mkdir -p "$OUT/wheels" && "$PY" -m wheel pack -d "$OUT/wheels" "$w" >&2
  $PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --platform any -d "$OUT/wheels" $FFA_PY_DEPS
  log "ffa built in $(( (SECONDS - t0) / 60 )) min"
}

# ---- FastVideo's VSA: its Python package (Triton kernels), and its ThunderKittens kernel -------------------
stage_vsa() {  # $1: what the wheel holds (METADATA's summary) -> $WORK/vsa/wheel, the package staged
  local d=$WORK/vsa w di
  rm -rf "$d" && mkdir -p "$d"
  # the sdist itself, from PyPI's simple index (pip download would build its CUDA extension's metadata)
  "$PY" - "$VSA_VERSION" "$d" <<'EOF'
import hashlib, re, sys, urllib.request
version, out = sys.argv[1], sys.argv[2]
index = urllib.request.urlopen("https://pypi.org/simple/fastvideo-kernel/").read().decode()
url, digest = re.search(rf'href="([^"#]*fastvideo_kernel-{re.escape(version)}\.tar\.gz)#sha256=([0-9a-f]+)"', index).groups()
data = urllib.request.urlopen(url).read()
assert hashlib.sha256(data).hexdigest() == digest, "fastvideo-kernel sdist: sha256 mismatch"
open(f"{out}/fastvideo_kernel-{version}.tar.gz", "wb").write(data)
EOF
  tar xzf "$d/fastvideo_kernel-$VSA_VERSION.tar.gz" -C "$d"
  w=$d/wheel di=$d/wheel/fastvideo_kernel-$VSA_VERSION.dist-info
  mkdir -p "$di" && cp -r "$d/fastvideo_kernel-$VSA_VERSION/python/fastvideo_kernel" "$w/"
  cp "$d/fastvideo_kernel-$VSA_VERSION/LICENSE" "$di/"
  find "$w" -name __pycache__ -prune -exec rm -rf {} +
  printf 'Metadata-Version: 2.1\nName: fastvideo-kernel\nVersion: %s\nSummary: fastvideo-kernel %s, %s\nRequires-Python: >=3.10\n' \
    "$VSA_VERSION" "$VSA_VERSION" "$1" > "$di/METADATA"
}

pack_vsa() {  # $1: wheel tag, $2: purelib (true/false)
  printf 'Wheel-Version: 1.0\nGenerator: build_kernels.sh\nRoot-Is-Purelib: %s\nTag: %s\n' "$2" "$1" \
    > "$WORK/vsa/wheel/fastvideo_kernel-$VSA_VERSION.dist-info/WHEEL"
  mkdir -p "$OUT/wheels" && rm -f "$OUT"/wheels/fastvideo_kernel-*.whl   # one fastvideo-kernel wheel: the last built
  "$PY" -m wheel pack -d "$OUT/wheels" "$WORK/vsa/wheel" >&2
  $PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --platform any -d "$OUT/wheels" einops==0.8.2
}

build_vsa() {  # what LongCA's vsa_triton calls, no CUDA build
  stage_vsa "its Python package only (Triton kernels; no compiled extension)"
  pack_vsa py3-none-any true
}

# vsa_cuda: the same package + fastvideo_kernel/_C/fastvideo_kernel_ops with block_sparse_fwd/bwd from
# csrc/attention/block_sparse_h100.cu (ThunderKittens at TK_COMMIT: the sdist lacks its include/tk
# submodule), sm_90a, by scripts/build_vsa_ext.py.  A superset of `vsa` (vsa_triton runs from it too).
build_vsa_cuda() {
  local t0=$SECONDS d=$WORK/vsa   # the compile's objects stay in $WORK/vsa-ext (stage_vsa empties $d)
  stage_vsa "its Python package + block_sparse_fwd/bwd (ThunderKittens, sm_90a; built by LongCA's build_kernels.sh)"
  git_export https://github.com/HazyResearch/ThunderKittens "$TK_COMMIT" "${TK_GIT_DIR:-}" "$d/tk" include prototype LICENSE
  TORCH_CUDA_ARCH_LIST=9.0a CUDA_VISIBLE_DEVICES="" $NICE "$PY" "$HERE/build_vsa_ext.py" \
    "$d/fastvideo_kernel-$VSA_VERSION" "$d/tk" "$WORK/vsa-ext" "$d/wheel" > "$d/build.log" 2>&1 ||
    { tail -40 "$d/build.log"; exit 1; }
  cp "$d/tk/LICENSE" "$d/wheel/fastvideo_kernel-$VSA_VERSION.dist-info/LICENSE.ThunderKittens"
  pack_vsa cp312-cp312-linux_x86_64 false
  log "vsa_cuda built in $(( (SECONDS - t0) / 60 )) min"
}

# ---- FlashInfer, its block-sparse prefill module prebuilt --------------------------------------------------
build_flashinfer() {
  local d=$WORK/flashinfer t0=$SECONDS
  rm -rf "$d/site" "$d/stage" && mkdir -p "$d/site" "$d/ws" "$d/stubs" "$d/stage"
  $PIP download -q --no-deps -d "$d" "flashinfer-python==$FLASHINFER_VERSION"
  $PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
    -d "$OUT/wheels" "apache-tvm-ffi==$TVM_FFI_VERSION"
  $PIP install -q --no-deps --target "$d/site" "$d"/flashinfer_python-*.whl "$OUT/wheels"/apache_tvm_ffi-*.whl
  $PIP install -q $FLASHINFER_BUILD_DEPS
  echo 'void longca_cuda_stub(void){}' | gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$d/stubs/libcuda.so" -x c -
  log "flashinfer: compiling the sm_90a batch-prefill module (FA3 backend, bf16, head dim 128)"
  CUDA_VISIBLE_DEVICES="" FLASHINFER_CUDA_ARCH_LIST="9.0a" FLASHINFER_WORKSPACE_BASE="$d/ws" \
  FLASHINFER_EXTRA_LDFLAGS="-L$d/stubs" FLASHINFER_NVCC_THREADS=1 PYTHONPATH="$d/site" \
    $NICE "$PY" - "$d/site/flashinfer/data/aot" <<'PYEOF'
import shutil, sys
from pathlib import Path
import torch
from flashinfer.jit.attention.modules import gen_batch_prefill_module
# (q, kv, o dtypes, index dtype, head dim qk, vo, pos. encoding NONE, no sliding window, no soft cap,
# no fp16 qk reduction): what the wrapper's plan() asks for with q_data_type=bf16 on Hopper.
spec = gen_batch_prefill_module("fa3", torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32, 128, 128,
                                0, False, False, False)
spec.build(verbose=False)
dest = Path(sys.argv[1]) / spec.name
dest.mkdir(parents=True, exist_ok=True)
shutil.copy2(spec.jit_library_path, dest / f"{spec.name}.so")
print(spec.name)
PYEOF
  # The package as `import flashinfer` and the wrapper load it: no JIT headers, no unused subpackages.
  ( cd "$d/site" && tar -cf - --exclude '__pycache__' flashinfer flashinfer_python-*.dist-info b12x ) | tar -C "$d/stage" -xf -
  ( cd "$d/stage/flashinfer" || exit 1
    rm -rf moe_ep data/include data/cccl data/cutlass data/spdlog
    find data/csrc -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
    find experimental -mindepth 1 -maxdepth 1 -type d ! -name cake_nvfp4_per_token -exec rm -rf {} + )
  PYTHONPATH="$d/stage:$d/site" CUDA_VISIBLE_DEVICES="" "$PY" -c \
    "import flashinfer; flashinfer.VariableBlockSparseAttentionWrapper; print('flashinfer', flashinfer.__version__, 'imports')"
  ( cd "$d/stage" && tar -cf - --owner=0 --group=0 . | $NICE xz -9 -T1 > "$OUT/wheels/flashinfer-$FLASHINFER_VERSION-sm90a.tar.xz" )
  log "flashinfer built in $(( (SECONDS - t0) / 60 )) min"
}

# ---- packing for the GPU machine ---------------------------------------------------------------------------
write_installer() {
  cat > "$OUT/install_kernels.sh" <<'EOF'
#!/usr/bin/env bash
# On the GPU machine: install one part of the kernel wheels into TARGET (default /tmp/site).
# Once per part, into the same TARGET.
#   bash install_kernels.sh PARTDIR [TARGET];  then: export PYTHONPATH=TARGET:$PYTHONPATH
# Wheels are installed one by one into a temporary folder and merged into TARGET, so flash-attn 2's
# flash_attn/ and FlashAttention-4's flash_attn/cute/ share one folder.
set -euo pipefail
PART=${1:?usage: install_kernels.sh PARTDIR [TARGET]}; T=${2:-/tmp/site}
mkdir -p "$T" /tmp/kernel-pieces
shopt -s nullglob
install_whl() {
  local tmp; tmp=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$tmp" "$1"
  cp -r "$tmp"/. "$T"/ && rm -rf "$tmp"; echo "installed $(basename "$1")"
}
for w in "$PART"/*.whl; do install_whl "$w"; done
# A package that is not a wheel (FlashInfer with its prebuilt modules) comes as a tar.xz of TARGET's layout.
for t in "$PART"/*.tar.xz; do tar -xJf "$t" -C "$T"; echo "unpacked $(basename "$t")"; done
# A wheel too big for one part comes as NAME.whl.partNN pieces (in several parts) + NAME.whl.sha256.
cp "$PART"/*.whl.part* "$PART"/*.whl.sha256 /tmp/kernel-pieces/ 2>/dev/null || true
for s in /tmp/kernel-pieces/*.whl.sha256; do
  w=${s%.sha256}; pieces=("$w".part*)
  [ ${#pieces[@]} -gt 0 ] || continue
  cat "${pieces[@]}" > "$w"
  if (cd /tmp/kernel-pieces && sha256sum -c --status "$(basename "$s")"); then
    install_whl "$w" && rm -f "$w" "$w".part* "$s"
  else
    rm -f "$w"; echo "$(basename "$w"): waiting for more pieces"
  fi
done
ls "$T"
EOF
}

pack() {
  local n=0 used=0 f sz PIECE=$((PART_BYTES - 100000))   # room for the installer and a checksum
  ls "$OUT"/wheels/*.whl >/dev/null 2>&1 || { echo "no wheels in $OUT/wheels" >&2; return 1; }
  rm -rf "$OUT"/part* "$OUT/pieces" && mkdir -p "$OUT/pieces"
  write_installer
  for f in "$OUT"/wheels/*.whl "$OUT"/wheels/*.tar.xz; do
    [ -e "$f" ] || continue
    if [ "$(stat -c %s "$f")" -gt "$PIECE" ]; then      # too big for one part: split it
      ( cd "$OUT/wheels" && sha256sum "$(basename "$f")" > "$OUT/pieces/$(basename "$f").sha256" )
      split -b "$PIECE" -d "$f" "$OUT/pieces/$(basename "$f").part"
    else
      ln -f "$f" "$OUT/pieces/"
    fi
  done
  # Fill parts of at most PART_BYTES (installer and checksums included): whole wheels first (biggest
  # first; so part1 alone gives FA2 and FA3), then the pieces of split wheels, in order.
  for f in $(ls -S "$OUT"/pieces/*.whl "$OUT"/pieces/*.tar.xz 2>/dev/null) $(ls "$OUT"/pieces/*.whl.part* 2>/dev/null); do
    sz=$(stat -c %s "$f")
    if [ "$n" -eq 0 ] || [ $((used + sz)) -gt "$PIECE" ]; then
      n=$((n + 1)); used=0; mkdir -p "$OUT/part$n"; cp "$OUT/install_kernels.sh" "$OUT/part$n/"
    fi
    mv "$f" "$OUT/part$n/"; used=$((used + sz))
    case $f in *.whl.part*) cp "${f%.part*}.sha256" "$OUT/part$n/" ;; esac
  done
  rm -rf "$OUT/pieces"
  write_install_txt "$n"
  du -sh "$OUT"/part*
}

write_install_txt() {  # $1: number of parts
  local k rel=${OUT_REL:-.gpu-bundles/kernels}
  have() { ls "$OUT"/wheels/"$1"*.whl >/dev/null 2>&1; }
  {
    echo "Attention-kernel wheels for a GPU machine (Python 3.12, torch 2.11.0+cu130, H100/H200, no network),"
    echo "built by scripts/build_kernels.sh ($(date -u +%F)).  Wheels: wheels/ (here only); parts for copying: part1..part$1."
    echo
    echo "On the GPU machine, one part after another, into the same folder:"
    for k in $(seq 1 "$1"); do
      echo "  bash $rel/part$k/install_kernels.sh $rel/part$k /tmp/site"
    done
    have flash_attn_3 && echo "part1 alone gives FA2 and FA3 (and TE's small wheels); TE needs all parts (its core wheel is split)."
    echo "then, in every shell that runs LongCA there:"
    echo "  export PYTHONPATH=/tmp/site:\$PYTHONPATH"
    echo "(with FlashAttention-4 from cutlass-dsl wheels in /tmp/site too, add /tmp/site/nvidia_cutlass_dsl/dsl_packages)"
    echo
    echo "install_kernels.sh runs, for each wheel (a wheel split into NAME.whl.partNN pieces is first put back"
    echo "together and checked against NAME.whl.sha256):"
    echo "  python3 -m pip install --no-deps --no-index --no-compile --target TMP WHEEL && cp -r TMP/. /tmp/site/"
    echo "Installing all wheels at once works too when the target has no flash_attn/ yet:"
    echo "  python3 -m pip install --no-deps --no-index --target DIR wheels/*.whl   # then PYTHONPATH=DIR"
    echo "but pip --target does not merge into an existing flash_attn/ (FA4's flash_attn/cute): merge by hand as above."
    echo
    echo "Import names:"
    have flash_attn- && echo "  FA2: flash_attn (flash_attn_func, flash_attn_varlen_func), extension flash_attn_2_cuda"
    have flash_attn_3 && echo "  FA3: flash_attn_interface (flash_attn_func, flash_attn_varlen_func), extension flash_attn_3._C (torch.ops.flash_attn_3)"
    have transformer_engine_torch && echo "  TE:  transformer_engine.pytorch (DotProductAttention), extension transformer_engine_torch, core transformer_engine/wheel_lib/libtransformer_engine.so"
    have flashmask- && echo "  FlashMask V3: flashmask (flashmask_attention), extension flashmask._C (torch.ops.flashmask.fwd/bwd); bf16, head dim 128, sm_90a (LongCA kernel flashmask)"
    ls "$OUT"/wheels/fastvideo_kernel-*-cp312-*.whl >/dev/null 2>&1 &&
      echo "  VSA: fastvideo_kernel (block_sparse_attn), extension fastvideo_kernel._C.fastvideo_kernel_ops (block_sparse_fwd/bwd, ThunderKittens sm_90a; LongCA kernels vsa_cuda, vsa_triton)"
    if have magi_attention; then
      echo "  FFA: magi_attention.functional.flex_flash_attn_func (MagiAttention $MAGI_COMMIT), extension"
      echo "       magi_attention.magi_attn_ext; kernels magi_attention/lib/<uri>/<uri>.so, loaded at first call:"
      ls "$WORK"/ffa/src/magi_attention/lib 2>/dev/null | sed 's/^/         /'
      echo "       only bf16, head dim 128, fwd+bwd with default flags (atomic fp32 out / fp32 dq dk dv; GQA without"
      echo "       pack_gqa/cat_gqa; no softcap/deterministic/swap_ab/sparse/max-logits): anything else tries nvcc (JIT) and fails."
      echo "       magi_attention writes rendered sources and a log under \$MAGI_ATTENTION_WORKSPACE_BASE/.cache/magi_attention"
      echo "       (default \$HOME): set it to a writable folder, e.g. export MAGI_ATTENTION_WORKSPACE_BASE=/tmp/magi."
      echo "       Leave MAGI_ATTENTION_FORCE_JIT_BUILD unset (=1 would ignore lib/ and compile).  No magi_attn_comm"
      echo "       (distributed group collectives): importing magi_attention warns about it, flex_flash_attn_func works."
      [ -f "$OUT/check/check_ffa.py" ] &&
        echo "  FFA smoke test (vs float32 SDPA, fwd+bwd, no compile at first call): python3 $rel/check/check_ffa.py"
    fi
    echo
    if have flashmask- || ls "$OUT"/wheels/fastvideo_kernel-*-cp312-*.whl >/dev/null 2>&1; then
      echo "Check FlashMask / VSA's CUDA kernel (the correctness gate, every mask they take, fwd + bwd, 64:8 GQA, head dim 128):"
      echo "  PYTHONPATH=/tmp/site:\$PYTHONPATH python -m longca check --kernels flashmask vsa_cuda --seqlen 1024 --heads-q 64 --heads-kv 8 --head-dim 128"
      echo
    fi
    if [ -f "$OUT/check/check_kernels.py" ]; then
      echo "Smoke test (FA2/FA3/TE vs a float32 reference, fwd+bwd): carry $rel/check too and run"
      echo "  PYTHONPATH=/tmp/site:\$PYTHONPATH python3 $rel/check/check_kernels.py [fa2] [fa3] [te]"
      echo
    fi
    echo "Contents:"
    for k in $(seq 1 "$1"); do echo "  part$k: $(cd "$OUT/part$k" && ls | grep -v '^install_kernels.sh$' | grep -v '\.sha256$' | tr '\n' ' ')"; done
  } > "$OUT/INSTALL.txt"
}

# --dry-run: what each named library would be built from and into, and nothing done (no toolchain,
# no download, no OUT_DIR).
describe() {
  case $1 in
    fa2) echo "fa2: flash-attn $FA2_VERSION (PyPI sdist), SASS for sm_${FA2_ARCHS//;/ + sm_}, hdim 128 bf16 -> wheels/flash_attn-*.whl" ;;
    te) echo "te: transformer_engine_torch $TE_VERSION (PyPI sdist) + transformer_engine_cu13 $TE_VERSION core wheel (sm_90 kept) -> wheels/transformer_engine*.whl" ;;
    fa3) echo "fa3: Dao-AILab/flash-attention@$FA3_COMMIT hopper/ + NVIDIA/cutlass@$CUTLASS_COMMIT include/, sm_90a; FLASH_ATTENTION_DISABLE_ $(echo $FA3_FLAGS) -> wheels/flash_attn_3-*.whl" ;;
    ffa) echo "ffa: SandAI-org/MagiAttention@$MAGI_COMMIT + NVIDIA/cutlass@$MAGI_CUTLASS_COMMIT, sm_90a AOT kernels -> wheels/magi_attention-$MAGI_VERSION-*.whl" ;;
    flashmask) echo "flashmask: PaddlePaddle/flash-attention@$FLASHMASK_COMMIT flashmask/flash_mask/flashmask_attention_v3 + NVIDIA/cutlass@$FLASHMASK_CUTLASS_COMMIT include/ (git dirs: ${FLASHMASK_GIT_DIR:-clone} ${CUTLASS_GIT_DIR:-clone}); scripts/patch_flashmask.py: bf16, hdim 128, fwd + bwd, sm_90a${FLASHMASK_INLINE_BWD:+, backward lambdas inlined} -> wheels/flashmask-$FLASHMASK_VERSION-cp39-abi3-linux_x86_64.whl (package flashmask, extension flashmask._C = torch.ops.flashmask)" ;;
    vsa) echo "vsa: fastvideo-kernel $VSA_VERSION (PyPI sdist), Python package only -> wheels/fastvideo_kernel-$VSA_VERSION-py3-none-any.whl + einops" ;;
    vsa_cuda) echo "vsa_cuda: fastvideo-kernel $VSA_VERSION (PyPI sdist) csrc/attention/block_sparse_h100.cu + HazyResearch/ThunderKittens@$TK_COMMIT (git dir: ${TK_GIT_DIR:-clone}); scripts/build_vsa_ext.py, sm_90a -> wheels/fastvideo_kernel-$VSA_VERSION-cp312-cp312-linux_x86_64.whl (fastvideo_kernel._C.fastvideo_kernel_ops: block_sparse_fwd/bwd) + einops" ;;
    flashinfer) echo "flashinfer: flashinfer-python $FLASHINFER_VERSION (PyPI wheel), batch-prefill module prebuilt for sm_90a -> wheels/flashinfer-$FLASHINFER_VERSION-sm90a.tar.xz + apache-tvm-ffi $TVM_FFI_VERSION" ;;
    pack) echo "pack: re-pack OUT_DIR/wheels" ;;
  esac
}
if [ -n "$DRY_RUN" ]; then
  echo "toolchain: $V (Python 3.12; torch $TORCH_VERSION+cu130, CUDA $CUDA_TOOLKIT from PyPI; MAX_JOBS=$MAX_JOBS, $NICE)"
  for lib in $LIBS; do describe "$lib"; done
  echo "then: OUT_DIR/part1..N (<= $PART_BYTES bytes each) + install_kernels.sh + INSTALL.txt in $OUT"
  exit 0
fi

toolchain
for lib in $LIBS; do
  case $lib in
    fa2) build_fa2 ;;
    te) build_te ;;
    fa3) build_fa3 ;;
    ffa) build_ffa ;;
    flashmask) build_flashmask ;;
    vsa) build_vsa ;;
    vsa_cuda) build_vsa_cuda ;;
    flashinfer) build_flashinfer ;;
    pack) ;;  # only (re)pack what OUT_DIR/wheels holds
  esac
done
pack
