#!/usr/bin/env bash
# The published table: `snakemake all --configfile config/gpu.yaml` on a GPU box, within a time
# budget, as many times as it takes (the cache keeps every finished cell).  `--help` says how.
set -u

usage() {
    cat <<'EOF'
usage: scripts/gpu_grid.sh OUTDIR [--budget-s N] [--work DIR] [--overrides FILE] [--target T] [-- SNAKEMAKE_ARGS...]
       scripts/gpu_grid.sh OUTDIR [--budget-s N] --as-written

Runs `snakemake all --configfile config/gpu.yaml [FILE] --cores 8 --resources gpu=<GPUs>` in DIR
(default: the repository root, so results/ is the run's) on the GPUs in CUDA_VISIBLE_DEVICES (default:
every GPU nvidia-smi lists), and stops it (SIGINT: running cells end as rows or are redone next time,
finished cells stay; a Snakemake still running 20 s later is killed and its lock removed) so that the
whole script ends within the budget.  Run the same command again to go on: only cells not yet
measured run.

OUTDIR gets: environment.txt (nvidia-smi, library versions), gpu_clocks.csv (SM clock, power,
temperature, utilisation twice a second), overrides.yaml (a copy of FILE), runs.txt (one line per
call: start, seconds, Snakemake's exit code, cells finished), snakemake.log, and a copy of the
run's results/ (the cells; the Parquet tables, figures and report once the grid is complete; not
its compile_cache/), and the same as one file, results.tar.gz, for a copy that keeps only shallow
folders or few files.  A partial grid is rendered with scripts/render_results.py.

options:
  --budget-s N      seconds this script may take (default 600, at least 60)
  --work DIR        the run directory (default: the repository root)
  --overrides FILE  a config file merged over config/gpu.yaml (say what you narrowed)
  --target T        what Snakemake makes (default all; results/cp.parquet: the CP cells and their table only)
  --as-written      run the README's one-box command exactly as a user types it,
                    `snakemake all --configfile config/gpu.yaml` in the repository root (`snakemake`
                    from PATH, every visible GPU, nothing added); with neither --work nor --overrides
  -h, --help        this text
Arguments after `--` go to Snakemake (e.g. `-- -n` lists the jobs without running them).
Python: $PYTHON (default python3).
EOF
}

die() { echo "gpu_grid.sh: $*" >&2; echo "(scripts/gpu_grid.sh --help for usage)" >&2; exit 2; }

OUTDIR="" BUDGET_S=600 WORK="" OVERRIDES="" AS_WRITTEN="" TARGET=all
SNAKEMAKE_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --budget-s) [ $# -ge 2 ] || die "--budget-s needs a number of seconds"; BUDGET_S=$2; shift 2 ;;
        --work) [ $# -ge 2 ] || die "--work needs a folder"; WORK=$2; shift 2 ;;
        --overrides) [ $# -ge 2 ] || die "--overrides needs a config file"; OVERRIDES=$2; shift 2 ;;
        --target) [ $# -ge 2 ] || die "--target needs a rule or file"; TARGET=$2; shift 2 ;;
        --as-written) AS_WRITTEN=1; shift ;;
        --) shift; SNAKEMAKE_ARGS=("$@"); break ;;
        -*) die "unknown option $1" ;;
        *) [ -z "$OUTDIR" ] || die "one output folder only (got $OUTDIR and $1)"; OUTDIR=$1; shift ;;
    esac
done
[ -n "$OUTDIR" ] || die "missing OUTDIR: the folder the results go to"
[[ "$BUDGET_S" =~ ^[0-9]+$ ]] && [ "$BUDGET_S" -ge 60 ] || die "--budget-s must be a whole number of seconds, at least 60"
[ -z "$OVERRIDES" ] || [ -f "$OVERRIDES" ] || die "--overrides: $OVERRIDES is not a file"
[ -z "$AS_WRITTEN" ] || { [ -z "$WORK$OVERRIDES${SNAKEMAKE_ARGS[*]}" ] && [ "$TARGET" = all ]; } \
    || die "--as-written runs the README's command unchanged: no --work, --overrides or Snakemake arguments"
PYTHON=${PYTHON:-python3}
mkdir -p "$OUTDIR" || die "cannot create $OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
[ -z "$OVERRIDES" ] || OVERRIDES=$(cd "$(dirname "$OVERRIDES")" && pwd)/$(basename "$OVERRIDES")
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$REPO}
mkdir -p "$WORK" || die "cannot create $WORK"
WORK=$(cd "$WORK" && pwd)
export PYTHONUNBUFFERED=1 PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
"$PYTHON" -c 'import snakemake' 2>/dev/null || die "$PYTHON has no Snakemake (pip install -e '.[hopper]' or snakemake)"

if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    IFS=',' read -ra GPUS <<< "$CUDA_VISIBLE_DEVICES"
else
    mapfile -t GPUS < <(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null)
fi
[ "${#GPUS[@]}" -gt 0 ] || die "no GPU: CUDA_VISIBLE_DEVICES is empty and nvidia-smi lists none"

{ nvidia-smi; "$PYTHON" - <<'EOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
for name in ("triton", "snakemake", "flash_attn", "cudnn", "cutlass"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as exc:  # noqa: BLE001 - absent libraries are part of the record
        print(name, "absent:", type(exc).__name__)
from longca.execution.measure.env import library_versions  # what each row records, by distribution
print("kernel libraries:", ", ".join(f"{d} {v}" for d, v in library_versions().items()) or "none")
EOF
} > "$OUTDIR/environment.txt" 2>&1
[ -z "$OVERRIDES" ] || cp "$OVERRIDES" "$OUTDIR/overrides.yaml"
SMI=""
if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,utilization.gpu \
        --format=csv -lms 500 >> "$OUTDIR/gpu_clocks.csv" 2>/dev/null &
    SMI=$!
fi

# Leave time to copy the results out; Snakemake needs a few seconds to stop its jobs on SIGINT.
left=$((BUDGET_S - 30))
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
t0=$SECONDS
count_cells() { find "$WORK/results/cells/$1" -name '*.json' 2>/dev/null | wc -l; }
cells_before=$(count_cells kernels) cp_before=$(count_cells cp)
VISIBLE=$(IFS=,; echo "${GPUS[*]}")
WORKFLOW=(-s "$REPO/Snakefile" --directory "$WORK" --configfile "$REPO/config/gpu.yaml" ${OVERRIDES:+"$OVERRIDES"})
if [ -n "$AS_WRITTEN" ]; then
    # What a user types in the repository root; Snakemake finds the GPUs (and the cores) itself.
    (cd "$REPO" && timeout -s INT -k 20 "$left" snakemake all --configfile config/gpu.yaml) >> "$OUTDIR/snakemake.log" 2>&1
else
    # Targets first: --configfile and --resources take every word after them.
    CUDA_VISIBLE_DEVICES=$VISIBLE timeout -s INT -k 20 "$left" "$PYTHON" -m snakemake "$TARGET" "${WORKFLOW[@]}" --cores 8 \
        --resources gpu=${#GPUS[@]} ${SNAKEMAKE_ARGS[@]+"${SNAKEMAKE_ARGS[@]}"} >> "$OUTDIR/snakemake.log" 2>&1
fi
code=$?
if [ "$code" -eq 137 ]; then
    # Snakemake did not stop within 20 s of SIGINT (a long cell was still running) and was killed, so
    # its lock on the run directory stays, and the next call would stop at once on it.  Nothing else
    # runs there: this script started that Snakemake and it is gone.
    CUDA_VISIBLE_DEVICES=$VISIBLE "$PYTHON" -m snakemake --unlock "${WORKFLOW[@]}" \
        ${SNAKEMAKE_ARGS[@]+"${SNAKEMAKE_ARGS[@]}"} >> "$OUTDIR/snakemake.log" 2>&1 \
        && echo "gpu_grid.sh: Snakemake was killed 20 s after SIGINT; its lock on $WORK is removed" \
        || echo "gpu_grid.sh: Snakemake was killed 20 s after SIGINT and \`snakemake --unlock\` failed (see $OUTDIR/snakemake.log)" >&2
fi
cells_after=$(count_cells kernels) cp_after=$(count_cells cp)
echo "$started $((SECONDS - t0)) s exit $code kernel cells $cells_before -> $cells_after cp cells $cp_before -> $cp_after" >> "$OUTDIR/runs.txt"
[ -z "$SMI" ] || kill "$SMI" 2>/dev/null
# The compilers' caches stay with the run (compiled kernels, not results).
[ ! -d "$WORK/results" ] || (cd "$WORK" && tar cf - --exclude=results/compile_cache results) | tar xf - -C "$OUTDIR"
# One file too: a finished cell must not be lost to a copy that keeps only shallow folders (a GPU
# box's results came back without results/cells/, 16 folders deep, on 2026-11-29).
[ ! -d "$WORK/results" ] || tar czf "$OUTDIR/results.tar.gz" -C "$WORK" --exclude=results/compile_cache results
echo "gpu_grid.sh: $((SECONDS - t0)) s, snakemake exit $code, kernel cells $cells_before -> $cells_after; in $OUTDIR"
