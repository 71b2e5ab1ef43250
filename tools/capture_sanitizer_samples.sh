#!/usr/bin/env bash
# Capture real compute-sanitizer outputs (XML + plain text) for tests/data/sanitizer/.
#
# Run on a GPU machine from the repository root:
#     PYTHONPATH=. tools/capture_sanitizer_samples.sh OUT_DIR
# Options (environment): PYTHON (default: python), CASES="name name ..." (default: all),
# CASE_TIMEOUT seconds per sanitized run (default 90), TEXT_RUNS=0 to skip the text-only
# reruns. Expect 4-8 minutes for all cases.
#
# Every sanitized command is built by cutedebug.analyses.sanitizer.build_command (the flags the runner
# uses) with child_env's environment, so the capture also checks our flag spellings on the
# real tool. Per case NAME it writes:
#   NAME.xml       --xml --save output
#   NAME.txt       stdout+stderr of that run
#   NAME.text.txt  stdout+stderr of the same run without --xml/--save (text report only)
#   NAME.cmd       the exact command and environment
# and one line per run to manifest.tsv: case, tool, mode, exit code, seconds.
# Plain runs (no sanitizer) of each program are timed for the slowdown figure.
set -u

OUT=${1:?usage: PYTHONPATH=. $0 OUT_DIR}
PY=${PYTHON:-python}
CASE_TIMEOUT=${CASE_TIMEOUT:-90}
TEXT_RUNS=${TEXT_RUNS:-1}
SAMPLES=tools/sanitizer_samples
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

if ! $PY -c 'import cutedebug.analyses.sanitizer' 2>/dev/null; then
    echo "cannot import cutedebug.analyses.sanitizer: run from the repo root with PYTHONPATH=." >&2
    exit 2
fi
SAN=$($PY -c 'from cutedebug.analyses.sanitizer import find_sanitizer; print(find_sanitizer() or "")')
if [ -z "$SAN" ]; then
    echo "compute-sanitizer not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda*/bin)" >&2
    exit 2
fi

{
    echo "# date: $(date -u +%FT%TZ)"
    echo "# sanitizer: $SAN"
    "$SAN" --version
    nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv 2>&1
    $PY - <<'EOF'
import platform, importlib.metadata as md
print("python", platform.python_version())
for pkg in ("torch", "nvidia-cutlass-dsl", "cuda-python", "cuda-bindings"):
    try:
        print(pkg, md.version(pkg))
    except md.PackageNotFoundError:
        pass
EOF
} >"$OUT/versions.txt" 2>&1
"$SAN" --help >"$OUT/help.txt" 2>&1
printf 'case\ttool\tmode\texit\tseconds\n' >"$OUT/manifest.tsv"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
selected() { [ -z "${CASES:-}" ] || [[ " $CASES " == *" $1 "* ]]; }

# run_case NAME TOOL [--api-errors] [--caching-on] -- PROGRAM ARGS...
run_case() {
    local name=$1 tool=$2
    shift 2
    local api="" caching_on=0
    while [ "$1" != "--" ]; do
        case $1 in
            --api-errors) api=--api-errors ;;
            --caching-on) caching_on=1 ;;
        esac
        shift
    done
    shift
    selected "$name" || return 0
    local -a envs cmd
    mapfile -t envs < <($PY -m cutedebug.analyses.sanitizer env "$tool")
    if [ "$caching_on" = 1 ]; then
        local -a kept=()
        for e in "${envs[@]}"; do
            [[ $e == PYTORCH_NO_CUDA_MEMORY_CACHING=* ]] || kept+=("$e")
        done
        envs=("${kept[@]}")
    fi
    local mode xml t0 rc
    for mode in xml text; do
        if [ "$mode" = text ] && [ "$TEXT_RUNS" = 0 ]; then continue; fi
        if [ "$mode" = xml ]; then xml="$OUT/$name.xml"; else xml=-; fi
        mapfile -t cmd < <($PY -m cutedebug.analyses.sanitizer command "$tool" "$xml" $api -- "$PY" "$@")
        local log="$OUT/$name.txt"
        [ "$mode" = text ] && log="$OUT/$name.text.txt"
        {
            printf 'env -u PYTORCH_NO_CUDA_MEMORY_CACHING'
            printf ' %q' "${envs[@]}" "${cmd[@]}"
            printf '\n'
        } >>"$OUT/$name.cmd"
        echo "[$name] $tool ($mode) ..." >&2
        t0=$(now)
        timeout -k 10 "$CASE_TIMEOUT" env -u PYTORCH_NO_CUDA_MEMORY_CACHING "${envs[@]}" \
            "${cmd[@]}" >"$log" 2>&1
        rc=$?
        printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$tool" "$mode" "$rc" "$(elapsed "$t0" "$(now)")" \
            >>"$OUT/manifest.tsv"
        echo "[$name] exit $rc" >&2
        # A run that hit the timeout would only hit it again without --xml.
        if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then break; fi
    done
}

# plain_run NAME -- PROGRAM ARGS...: the same program without the sanitizer, timed.
plain_run() {
    local name=$1
    shift 2
    selected "$name" || return 0
    local t0 rc
    echo "[$name] plain ..." >&2
    t0=$(now)
    timeout -k 5 60 env CUTE_DSL_LINEINFO=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$PY" "$@" \
        >"$OUT/$name.txt" 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "-" "plain" "$rc" "$(elapsed "$t0" "$(now)")" \
        >>"$OUT/manifest.tsv"
}

# The findings first (a run killed by an outer time limit still leaves these), controls after.
# racecheck: shared-memory RAW hazard between warps (missing sync_threads).
run_case racecheck_raw racecheck -- "$SAMPLES/race_smem.py"
# memcheck: invalid __global__ write (kernels/minimal.py oob_store), caching allocator off.
run_case memcheck_oob memcheck -- "$SAMPLES/oob_store.py"
# synccheck: sync_threads in divergent code (within warps; across warps).
run_case synccheck_divergent_warp synccheck -- "$SAMPLES/divergent_barrier.py" --mode warp
# synccheck: barrier misuse in a real pipeline (tma_stream with a cutedebug fault injected):
# the mbarrier init not fenced before the TMA signals it; one consumer_release too many.
run_case synccheck_unfenced_init synccheck -- "$SAMPLES/scenario_run.py" \
    scenarios/tma_stream/missing_init_fence.toml
run_case synccheck_extra_release synccheck -- "$SAMPLES/scenario_run.py" \
    scenarios/tma_stream/extra_consumer_release.toml
# initcheck: load of a torch.empty buffer nothing wrote.
run_case initcheck_uninit initcheck -- "$SAMPLES/uninit_read.py"
# memcheck with API errors reported: cuda-bindings' cuGetProcAddress probing noise.
run_case memcheck_api_noise memcheck --api-errors -- "$SAMPLES/race_smem.py" --sync
# Controls: the same kernels fixed (no false alarms), caching on (expected to hide the OOB).
run_case racecheck_clean racecheck -- "$SAMPLES/race_smem.py" --sync
run_case memcheck_clean memcheck -- "$SAMPLES/oob_store.py" --clean
run_case memcheck_oob_cached memcheck --caching-on -- "$SAMPLES/oob_store.py"
run_case synccheck_divergent_block synccheck -- "$SAMPLES/divergent_barrier.py" --mode block
run_case synccheck_clean synccheck -- "$SAMPLES/divergent_barrier.py" --mode none
run_case initcheck_clean initcheck -- "$SAMPLES/uninit_read.py" --init

plain_run plain_race_smem -- "$SAMPLES/race_smem.py" --sync
plain_run plain_oob_store -- "$SAMPLES/oob_store.py" --clean
plain_run plain_uninit_read -- "$SAMPLES/uninit_read.py" --init
plain_run plain_divergent_barrier -- "$SAMPLES/divergent_barrier.py" --mode none

echo "done: $OUT" >&2
column -t -s $'\t' "$OUT/manifest.tsv" >&2 2>/dev/null || cat "$OUT/manifest.tsv" >&2
