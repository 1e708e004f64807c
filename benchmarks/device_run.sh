#!/usr/bin/env bash
# LongCA on a lent GPU box (the device tool): the workflow itself on one GPU and the kernel
# harness-versus-do_bench check on another, side by side, in one call.  Everything lands in $OUT.
#
#   run(kind="nvidia-h200-x2", carry=[".whl"], command="bash benchmarks/device_run.sh")
#
# The image has torch, Triton, pandas, pyarrow, matplotlib and jinja2 but not Snakemake: it comes
# as wheels in .whl/ (docs/results/README.md says how they were fetched).  Knobs (environment):
#   LONGCA_RUN_S       seconds this script may take in all (default 290)
#   LONGCA_BENCH_GPU   GPU for benchmarks/bench_kernels.py (default 0; empty: no bench)
#   LONGCA_FLOW_GPU    GPU for the workflow's kernel cells (default 1; empty: no workflow)
#   LONGCA_BENCH_SEQLENS  the bench's lengths, in order (default "8192 32768 16384")
#   LONGCA_STAGES      seqlen lists the workflow runs in turn, ';'-separated, each a superset of the
#                      last, so every finished stage is a complete grid (the cache keeps earlier cells)
#   LONGCA_SNAKEMAKE_ARGS  more Snakemake flags (`-n` checks this script on a machine without a GPU)
set -u
OUT=${OUT:?the device tool sets OUT}
RUN_S=${LONGCA_RUN_S:-290}
BENCH_GPU=${LONGCA_BENCH_GPU-0}
FLOW_GPU=${LONGCA_FLOW_GPU-1}
BENCH_SEQLENS=${LONGCA_BENCH_SEQLENS:-8192 32768 16384}
LONGCA_SNAKEMAKE_ARGS=${LONGCA_SNAKEMAKE_ARGS:-}
STAGES=${LONGCA_STAGES:-"[8192];[2048,8192];[2048,8192,32768]"}
# NVLink multicast stays off (the device README: it can take a shared host's GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

# Snakemake from the carried wheels, unless this Python already has it.
if ! python3 -c 'import snakemake' 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "wheel install failed"; exit 1; }
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
{ nvidia-smi; python3 -c 'import torch, triton, snakemake; print(torch.__version__, torch.version.cuda,
  torch.backends.cudnn.version(), triton.__version__, snakemake.__version__)'; } > "$OUT/environment.txt" 2>&1
# Clocks, power and temperature of every GPU, twice a second: what the timings ran under.
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,utilization.gpu \
    --format=csv -lms 500 > "$OUT/gpu_clocks.csv" 2>/dev/null &
SMI=$!

deadline=$((SECONDS + RUN_S))
if [ -n "$BENCH_GPU" ]; then
    CUDA_VISIBLE_DEVICES=$BENCH_GPU timeout $((RUN_S - 20)) python3 benchmarks/bench_kernels.py \
        --seqlens $BENCH_SEQLENS --kernels flex sdpa_cudnn sdpa_flash triton_block_sparse varlen_attn \
        --compare-dense-up-to 8192 --budget-s $((RUN_S - 40)) --out "$OUT/bench_kernels.jsonl" \
        > "$OUT/bench_kernels.log" 2>&1 &
    BENCH=$!
fi

# The workflow: paper-scale config/gpu.yaml narrowed to what fits one call (docs/results/README.md).
cat > /tmp/device_overrides.yaml <<'EOF'
kernels: [sdpa_cudnn, sdpa_flash, flex, varlen_attn, triton_block_sparse]
timing: {warmup: 2, reps: 10}
cp_strategies: []
EOF
run_dir=/tmp/longca_run
mkdir -p "$run_dir/results"
cp /tmp/device_overrides.yaml "$run_dir/stages.txt.overrides.yaml"
IFS=';' read -ra seqlen_stages <<< "$STAGES"
stage=0
for seqlens in "${seqlen_stages[@]}"; do
    [ -n "$FLOW_GPU" ] || break
    left=$((deadline - SECONDS - 25))
    [ "$left" -gt 30 ] || break
    stage=$((stage + 1))
    echo "stage $stage: seqlens $seqlens, $left s left" >> "$run_dir/stages.txt"
    echo "seqlens: $seqlens" > /tmp/stage$stage.yaml  # (--config would pass the numbers as strings)
    # Targets first: --configfile and --resources take every word after them.
    CUDA_VISIBLE_DEVICES=$FLOW_GPU timeout -s INT "$left" python3 -m snakemake results/kernels.parquet \
        results/ceilings.json -s Snakefile --directory "$run_dir" --cores 8 \
        --configfile config/gpu.yaml /tmp/device_overrides.yaml /tmp/stage$stage.yaml \
        --resources gpu=1 $LONGCA_SNAKEMAKE_ARGS > "$run_dir/stage$stage.log" 2>&1
    echo "stage $stage exit $?" >> "$run_dir/stages.txt"
    # Each finished stage's cells and tables come back even if a later stage is cut off (one
    # archive: the device tool returns at most 8 files, none deeper than two folders).
    tar czf "$OUT/workflow.tgz.part" -C "$run_dir" results stages.txt stages.txt.overrides.yaml \
        $(cd "$run_dir" && ls stage*.log) \
        && mv "$OUT/workflow.tgz.part" "$OUT/workflow.tgz" || rm -f "$OUT/workflow.tgz.part"
done
[ -n "${BENCH:-}" ] && wait "$BENCH"
kill "$SMI" 2>/dev/null
echo "done after $SECONDS s"
