"""scripts/build_kernels.sh's argument handling and the pieces its FlashMask and VSA builds generate,
without building anything: ``--dry-run`` names each library's pinned sources and outputs and touches
nothing; an unknown name fails before the toolchain download; scripts/patch_flashmask.py restricts
FlashMask V3's setup_torch.py (upstream's lines, as at the pinned commit) to bf16 / head dim 128 /
non-deterministic and fails loudly when upstream's text moved; build_vsa_ext.py's binding exports
the two ops fastvideo-kernel's Python looks up."""

import re
import subprocess
from pathlib import Path

import build_vsa_ext
import patch_flashmask
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build_kernels.sh"


def _run(*args):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_dry_run_names_pinned_sources_and_outputs_and_creates_nothing(tmp_path):
    out = tmp_path / "bundle"
    done = _run(str(out), "flashmask", "vsa_cuda", "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = {line.split(":")[0]: line for line in done.stdout.splitlines()}
    assert re.search(r"PaddlePaddle/flash-attention@[0-9a-f]{40} flashmask/flash_mask/flashmask_attention_v3",
                     lines["flashmask"])
    assert re.search(r"NVIDIA/cutlass@[0-9a-f]{40}", lines["flashmask"]) and "flashmask._C" in lines["flashmask"]
    assert re.search(r"HazyResearch/ThunderKittens@[0-9a-f]{40}", lines["vsa_cuda"])
    assert "block_sparse_h100.cu" in lines["vsa_cuda"] and "cp312-cp312" in lines["vsa_cuda"]
    assert set(lines) >= {"toolchain", "flashmask", "vsa_cuda", "then"} and "fa2" not in lines
    assert not out.exists()


def test_an_unknown_library_fails_before_anything_is_made(tmp_path):
    done = _run(str(tmp_path / "bundle"), "flashmask", "flashmsk")
    assert done.returncode == 2 and "unknown library flashmsk" in done.stderr and "vsa_cuda" in done.stderr
    assert not (tmp_path / "bundle").exists()


# The lines of setup_torch.py / flash_api_cuda_torch.cu that patch_flashmask edits, as upstream has them.
SETUP = '''
        cuda_post_cflags_sm80_sm90 = cuda_post_cflags + \\
            ['-gencode', 'arch=compute_80,code=sm_80']
DISABLE_HDIM64 = False  # on
DISABLE_HDIM128 = False  # on
DISABLE_HDIM256 = False  # on
subprocess.run(["git", "submodule", "update", "--init", "cutlass"])
    DETERM_FLAGS = ["", "_determ"]
def get_package_version():
    return "3.0.0b1"
    py_modules=["interface_torch"],
'''
API = '''void run_mha_bwd(Flash_bwd_params &params, cudaStream_t stream) {
        BOOL_SWITCH(params.deterministic, Deterministic, [&] {
'''


def test_patch_flashmask_keeps_head_dim_128_bf16_and_the_non_deterministic_backward():
    setup = patch_flashmask.patch_setup(SETUP, "3.0.0b1+gabc")
    namespace = {}
    exec("\n".join(line.strip() for line in setup.splitlines() if line.strip().startswith(("DISABLE_", "DETERM"))),
         namespace)
    assert (namespace["DISABLE_HDIM64"], namespace["DISABLE_HDIM128"], namespace["DISABLE_HDIM256"]) == (True, False, True)
    assert all(namespace[name] for name in patch_flashmask.DISABLED) and namespace["DETERM_FLAGS"] == [""]
    assert "compute_80" not in setup and "interface_torch" not in setup and '"3.0.0b1+gabc"' in setup
    assert "submodule" not in setup
    api = patch_flashmask.patch_api(API)
    assert "BOOL_SWITCH(params.deterministic" not in api
    assert api.index("#define LONGCA_NONDETERMINISTIC") < api.index("void run_mha_bwd")


def test_patch_flashmask_fails_naming_an_edit_whose_text_moved():
    with pytest.raises(SystemExit, match="deterministic backward: expected 1 match, found 0"):
        patch_flashmask.patch_setup(SETUP.replace('DETERM_FLAGS = ["", "_determ"]', "DETERM_FLAGS = DETERM"), "v")


def test_the_vsa_binding_exports_what_fastvideo_kernels_python_looks_up():
    assert re.findall(r'm\.def\("(\w+)"', build_vsa_ext.BINDING) == ["block_sparse_fwd", "block_sparse_bwd"]
    assert "-DKITTENS_HOPPER" in build_vsa_ext.CUDA_FLAGS and any("sm_90a" in f for f in build_vsa_ext.CUDA_FLAGS)
    # the driver library stays a dependency although the stub it links against defines nothing
    assert build_vsa_ext.LINK_CUDA == ["-Wl,--no-as-needed", "-lcuda", "-Wl,--as-needed"]
