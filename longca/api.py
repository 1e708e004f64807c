"""The tool's names for code outside it: the lab (``lab/``) and your own scripts.

``from longca.api import CellSpec, run_cell, tables`` gives what the measurement, the results and the
attention model offer to code that studies LongCA or builds on it, without reaching into the layers.
The lab imports ``longca`` through this module only (``tests/test_lab_boundary.py``).  Names resolve
on first use, so importing this module loads nothing else.
"""

from __future__ import annotations

import importlib

# name -> the module it is, or "module:attribute" it comes from.
NAMES: dict[str, str] = {
    "cell": "longca.execution.measure.cell",
    "compile_cache": "longca.execution.cache.compile_cache",
    "config": "longca.config",
    "cp": "longca.cp",
    "cp_model": "longca.results.cp_model",
    "graphed": "longca.execution.measure.graphed",
    "kernels": "longca.kernels",
    "layout": "longca.cp.layout",
    "mask_convert": "longca.attention.mask_convert",
    "masks": "longca.attention.masks",
    "parquet": "longca.results.parquet",
    "plots": "longca.results.plots",
    "reference": "longca.attention.reference",
    "sparse": "longca.results.sparse",
    "store": "longca.execution.cache.store",
    "tables": "longca.results.tables",
    "timed": "longca.execution.measure.timed",
    "timing": "longca.execution.measure.timing",
    "triton_block_sparse": "longca.kernels.triton_block_sparse",
    "BlockAttention": "longca.cp.local:BlockAttention",
    "sent_bytes": "longca.cp.comm:sent_bytes",
    "cp_seqlen": "longca.cells:cp_seqlen",
    "CPSpec": "longca.execution.measure.cp_cell:CPSpec",
    "CallReading": "longca.execution.measure.call_memory:CallReading",
    "CellSpec": "longca.execution.measure.cell:CellSpec",
    "PATTERNS": "longca.attention.masks:PATTERNS",
    "Problem": "longca.attention.problem:Problem",
    "area": "longca.cp.blocks:area",
    "attention_flops": "longca.attention.flops:attention_flops",
    "block_sparsity": "longca.attention.mask_convert:block_sparsity",
    "build": "longca.attention.masks:build",
    "cell_call": "longca.execution.measure.timed:cell_call",
    "cell_name": "longca.cells:cell_name",
    "correctness_gate": "longca.execution.measure.gate:correctness_gate",
    "gate_problem": "longca.execution.measure.gate:gate_problem",
    "is_oom": "longca.execution.measure.cell:is_oom",
    "measure_memory": "longca.execution.measure.memory:measure_memory",
    "parse_dtype": "longca.attention.problem:parse_dtype",
    "restrict": "longca.cp.blocks:restrict",
    "run_cell": "longca.execution.measure.cell:run_cell",
    "run_cp_cell": "longca.execution.measure.cp_cell:run_cell",  # run_cell is the kernel cell's
    "seqlen_label": "longca.results.tables:seqlen_label",
    "time_kernel": "longca.execution.measure.timed:time_kernel",
    "timed_call": "longca.execution.measure.timed:timed_call",
}


def __getattr__(name: str):
    try:
        target = NAMES[name]
    except KeyError:
        raise AttributeError(f"longca.api has no {name!r}; it offers {', '.join(sorted(NAMES))}") from None
    module, _, attribute = target.partition(":")
    value = importlib.import_module(module)
    if attribute:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(NAMES)


__all__ = sorted(NAMES)
