"""GPU models by the memory a process can use on them: what a table's ``device_name`` or a user's
``--gpu`` names, for "does this length fit?".

The figures are the total memory ``nvidia-smi`` reports for each model (MiB), which is what
``torch.cuda.mem_get_info`` starts from: the CUDA context and the allocator's fragmentation come off
it, so a length predicted to fit within a few percent of it may not.
"""

from __future__ import annotations

MIB = 2**20
GIB = 2**30

# Model -> total memory, MiB as nvidia-smi reports it.
MEMORY_MIB: dict[str, int] = {
    "H100": 81559,   # H100 80GB HBM3 (SXM)
    "H200": 143771,  # H200 141 GB HBM3e
    "B200": 183359,  # B200 180 GB HBM3e
}


# Model -> its streaming multiprocessors' architecture and count (what its dense tensor-core peak is
# made of: longca.results.peak).  The PCIe H100 has fewer SMs than the SXM one under the same model.
SMS: dict[str, tuple[str, int]] = {
    "H100": ("sm_90", 132),       # SXM and NVL
    "H100 PCIE": ("sm_90", 114),
    "H200": ("sm_90", 132),
}


def model_of(device_name: str) -> str | None:
    """The model a ``device_name`` column names ("NVIDIA H200" -> "H200"), if known."""
    words = str(device_name).upper().replace("-", " ").split()
    return next((m for m in MEMORY_MIB if m in words), None)


def sms_of(device_name: str | None) -> tuple[str, int] | None:
    """``(architecture, SMs)`` of the model a ``device_name`` names, if known."""
    model = model_of(device_name) if device_name else None
    if model and f"{model} PCIE" in SMS and "PCIE" in str(device_name).upper().split():
        model = f"{model} PCIE"
    return SMS.get(model) if model else None


def memory_bytes(name: str) -> int | None:
    """Total memory of a model (``H200``) or of the model a ``device_name`` names; None if unknown."""
    model = name.upper() if name.upper() in MEMORY_MIB else model_of(name)
    return MEMORY_MIB[model] * MIB if model else None
