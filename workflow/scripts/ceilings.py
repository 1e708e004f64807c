# The machine's measured ceilings (longca.execution.measure.ceilings) on the cells' device, with the cells' threads.
# On GPU the measurement takes a GPU slot like a cell does, so it never shares a device with one.
import contextlib
import os
import sys

sm = snakemake  # noqa: F821
with open(sm.log[0], "w") as log, contextlib.redirect_stderr(log):
    slot = contextlib.nullcontext()
    if sm.params.device == "cuda":
        from longca.execution.processes import gpu_slots

        # config `gpus` only says how many GPUs cells may use: not a param, so changing it reruns nothing.
        slot = gpu_slots.acquire(gpu_slots.visible_devices(sm.config.get("gpus") or 0))
        os.environ["CUDA_VISIBLE_DEVICES"] = slot.device  # before CUDA is initialised
    with slot:
        from longca.execution.measure import ceilings

        result = ceilings.write(sm.params.device, list(sm.params.dtypes), sm.output[0], threads=sm.threads)
    if result.get("error"):
        print(f"no ceiling measured: {result['error']}", file=sys.stderr)
    for entry in result["matmul"]:
        print(f"matmul {entry['dtype']} n={entry['n']}: {entry['tflops']:.4g} TFLOPs/s "
              f"(median {entry['median_ms']:.4g} ms)", file=sys.stderr)
