#!/usr/bin/env bash
# LongCA on a GPU box, within a time budget: the workflow's kernel cells on one GPU and the harness
# check against a bare do_bench loop (lab/longca_lab/bench_kernels.py) on another, side by side.
# What docs/results/ and docs/kernels.md report was measured this way.  `--help` says how to call it.
set -u

usage() {
    cat <<'EOF'
usage: scripts/device_run.sh OUTDIR [options] [-- SNAKEMAKE_ARGS...]

Runs, within a time budget, on the GPUs in CUDA_VISIBLE_DEVICES (default: every GPU nvidia-smi lists):
  * the workflow (config/gpu.yaml narrowed: 5 kernels, reps 10, no CP) on one GPU, in stages of
    growing seqlen lists, each a complete grid (the cache keeps earlier stages' cells);
  * lab/longca_lab/bench_kernels.py (the harness against a bare do_bench loop) on another GPU.
With two or more GPUs both run at once, on the first (bench) and second (workflow) visible GPU;
with one GPU the workflow has the first half of the budget and the bench the rest.

Everything lands in OUTDIR (created if missing): environment.txt, gpu_clocks.csv (SM clock,
power, temperature twice a second), bench_kernels.jsonl/.log, workflow/ (the run directory:
results/, stages.txt, stageN.log, overrides.yaml).

options:
  --budget-s N         seconds the whole script may take (default 600)
  --stages LISTS       seqlen lists the workflow runs in turn, ';'-separated
                       (default "[8192];[2048,8192];[2048,8192,32768]")
  --bench-seqlens "N…"   the bench's lengths, in order (default "8192 32768 16384")
  --no-bench           run only the workflow
  --no-workflow        run only the bench
  --wheels DIR         if this Python has no Snakemake, install the wheels in DIR first
                       (no index, no network: for a machine that cannot reach PyPI)
  -h, --help           this text
Arguments after `--` go to Snakemake (e.g. `-- -n` checks the script on a machine without a GPU).
Python: $PYTHON (default python3).
EOF
}

die() { echo "device_run.sh: $*" >&2; echo "(scripts/device_run.sh --help for usage)" >&2; exit 2; }

OUTDIR=""
BUDGET_S=600
STAGES="[8192];[2048,8192];[2048,8192,32768]"
BENCH_SEQLENS="8192 32768 16384"
RUN_BENCH=1
RUN_FLOW=1
WHEELS=""
SNAKEMAKE_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --budget-s) [ $# -ge 2 ] || die "--budget-s needs a number of seconds"; BUDGET_S=$2; shift 2 ;;
        --stages) [ $# -ge 2 ] || die "--stages needs a value"; STAGES=$2; shift 2 ;;
        --bench-seqlens) [ $# -ge 2 ] || die "--bench-seqlens needs a value"; BENCH_SEQLENS=$2; shift 2 ;;
        --no-bench) RUN_BENCH=0; shift ;;
        --no-workflow) RUN_FLOW=0; shift ;;
        --wheels) [ $# -ge 2 ] || die "--wheels needs a folder"; WHEELS=$2; shift 2 ;;
        --) shift; SNAKEMAKE_ARGS=("$@"); break ;;
        -*) die "unknown option $1" ;;
        *) [ -z "$OUTDIR" ] || die "one output folder only (got $OUTDIR and $1)"; OUTDIR=$1; shift ;;
    esac
done
[ -n "$OUTDIR" ] || die "missing OUTDIR: the folder the results go to"
[[ "$BUDGET_S" =~ ^[0-9]+$ ]] && [ "$BUDGET_S" -ge 60 ] \
    || die "--budget-s must be a whole number of seconds, at least 60"
[ -z "$WHEELS" ] || [ -d "$WHEELS" ] || die "--wheels: $WHEELS is not a folder"
PYTHON=${PYTHON:-python3}

mkdir -p "$OUTDIR" || die "cannot create $OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
[ -z "$WHEELS" ] || WHEELS=$(cd "$WHEELS" && pwd)
cd "$(dirname "$0")/.."  # the repository root: Snakefile, config/, scripts/
export PYTHONUNBUFFERED=1

# The GPUs: CUDA_VISIBLE_DEVICES as given, else every GPU the driver lists.
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    IFS=',' read -ra GPUS <<< "$CUDA_VISIBLE_DEVICES"
else
    mapfile -t GPUS < <(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null)
fi
[ "${#GPUS[@]}" -gt 0 ] || die "no GPU: CUDA_VISIBLE_DEVICES is empty and nvidia-smi lists none"
BENCH_GPU=${GPUS[0]}
FLOW_GPU=${GPUS[1]:-${GPUS[0]}}
# One GPU for both: one after the other, so neither skews the other's timings.
SEQUENTIAL=$([ "$RUN_BENCH$RUN_FLOW" = 11 ] && [ "$BENCH_GPU" = "$FLOW_GPU" ] && echo 1 || echo 0)

if ! "$PYTHON" -c 'import snakemake' 2>/dev/null && [ "$RUN_FLOW" = 1 ]; then
    [ -n "$WHEELS" ] || die "$PYTHON has no Snakemake: pip install snakemake, or pass --wheels DIR"
    site="$OUTDIR/.site"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$WHEELS"/*.whl || die "installing the wheels in $WHEELS failed"
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

{ nvidia-smi; "$PYTHON" -c 'import torch, triton, snakemake; print(torch.__version__, torch.version.cuda,
  torch.backends.cudnn.version(), triton.__version__, snakemake.__version__)'; } > "$OUTDIR/environment.txt" 2>&1
# Clocks, power and temperature of every GPU, twice a second: what the timings ran under.
SMI=""
if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,utilization.gpu \
        --format=csv -lms 500 > "$OUTDIR/gpu_clocks.csv" 2>/dev/null &
    SMI=$!
fi

deadline=$((SECONDS + BUDGET_S))
flow_deadline=$deadline
[ "$SEQUENTIAL" = 0 ] || flow_deadline=$((SECONDS + BUDGET_S / 2))

run_bench() {
    local left=$((deadline - SECONDS))
    CUDA_VISIBLE_DEVICES=$BENCH_GPU timeout $((left - 20)) "$PYTHON" lab/longca_lab/bench_kernels.py \
        --seqlens $BENCH_SEQLENS --kernels flex sdpa_cudnn sdpa_flash triton_block_sparse varlen_attn \
        --compare-dense-up-to 8192 --budget-s $((left - 40)) --out "$OUTDIR/bench_kernels.jsonl" \
        > "$OUTDIR/bench_kernels.log" 2>&1
}

# The workflow: paper-scale config/gpu.yaml narrowed to what fits a short budget (docs/results/README.md).
run_workflow() {
    local run_dir="$OUTDIR/workflow" stage=0 seqlens left
    mkdir -p "$run_dir"
    cat > "$run_dir/overrides.yaml" <<'EOF'
kernels: [sdpa_cudnn, sdpa_flash, flex, varlen_attn, triton_block_sparse]
timing: {warmup: 2, reps: 10}
cp_strategies: []
EOF
    IFS=';' read -ra seqlen_stages <<< "$STAGES"
    for seqlens in "${seqlen_stages[@]}"; do
        left=$((flow_deadline - SECONDS - 25))
        [ "$left" -gt 30 ] || break
        stage=$((stage + 1))
        echo "stage $stage: seqlens $seqlens, $left s left" >> "$run_dir/stages.txt"
        # Targets first: --configfile and --resources take every word after them.
        CUDA_VISIBLE_DEVICES=$FLOW_GPU timeout -s INT "$left" "$PYTHON" -m snakemake results/kernels.parquet \
            results/ceilings.json -s "$PWD/Snakefile" --directory "$run_dir" --cores 8 \
            --configfile config/gpu.yaml "$run_dir/overrides.yaml" --resources gpu=1 \
            ${SNAKEMAKE_ARGS[@]+"${SNAKEMAKE_ARGS[@]}"} --config "seqlens=$seqlens" > "$run_dir/stage$stage.log" 2>&1
        echo "stage $stage exit $?" >> "$run_dir/stages.txt"
    done
}

if [ "$SEQUENTIAL" = 1 ]; then
    run_workflow
    run_bench
else
    [ "$RUN_BENCH" = 0 ] || { run_bench & BENCH=$!; }
    [ "$RUN_FLOW" = 0 ] || run_workflow
    [ -z "${BENCH:-}" ] || wait "$BENCH"
fi
[ -z "$SMI" ] || kill "$SMI" 2>/dev/null
echo "done after $SECONDS s; results in $OUTDIR"
