#!/usr/bin/env bash
# The GPU check: build bevy-gguf with CUDA on a machine that has a GPU but no package registry,
# then one bench against stock llama.cpp -ngl 99 (and -ngl 99 -ot exps=CPU) with the expert cache
# on the GPU, its report written into OUTDIR.
#
#   scripts/gpu_check.sh [--dry-run-cpu] [--phase all|build|bench] [OUTDIR]     (OUTDIR: default $OUT)
#
# What it carries (make gpu-bundle writes it, build/gpu-bundle): the pinned llama.cpp source,
# pruned (scripts/fetch_llama.py --make-pruned, ~5 MB), and the wheels of the Python packages such
# a machine lacks (gguf; diskcache, which the binding imports). The machine must have python3
# (3.10+, with numpy, tqdm, matplotlib, pyyaml, requests, pytest, jinja2, typing_extensions), CMake,
# ninja and, without --dry-run-cpu, nvcc.
#
# Steps, each time-boxed, each line of OUTDIR/steps.txt saying how it ended and how long it took:
#   site    the bundle's wheels and the binding's Python files into WORK/site (PYTHONPATH)
#   fetch   the stock and patched trees from the pruned source (patches/ applied)
#   build   stock and patched llama.cpp with CUDA (CUDA_ARCHS, default 90; -j JOBS, default the cores;
#           FlashAttention kernels off unless CUDA_FA=1: far fewer kernels to compile), and libbevy;
#           meanwhile `make-model` writes the model (a qwen3-30b-a3b shape, 4 layers)
#   tests   tests/e2e/test_cuda.py (blocking on CUDA slots = stock -ngl 99, CUDA graphs on and off)
#   bench   stock-resident, stock-offload, blocking, bevy-ctx, bevy at --parallel 8, two cache points,
#           -ngl 99 --device CUDA0, experts behind the host-RAM link (report.md/json into OUTDIR)
# --phase build stops after the build, --phase bench starts at the tests (two device calls of under
# 10 minutes each: the build outputs stay on a warm machine in between).
#
# --dry-run-cpu: the same steps on this CPU (no CUDA; ggml's CPU device in place of CUDA0; -j JOBS; a
# tiny model; a fresh venv holding only the packages such a machine has, installed from PyPI as its
# stand-in), into WORK=build/gpu-check; `make gpu-dry-run` runs it.
set -uo pipefail

DRY=0
PHASE=all
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dry-run-cpu) DRY=1; shift ;;
        --phase) PHASE="${2:-}"; shift 2 ;;
        -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
        -*) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
case "$PHASE" in all|build|bench) ;; *) echo "gpu_check: --phase $PHASE: choose all, build or bench" >&2; exit 2 ;; esac
OUTDIR="${1:-${OUT:-}}"
if [[ -z "$OUTDIR" ]]; then
    echo "gpu_check: give OUTDIR (or set OUT)" >&2
    exit 2
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 2
mkdir -p "$OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd)"
BUNDLE="${BEVY_GPU_BUNDLE:-$ROOT/build/gpu-bundle}"
STEPS="$OUTDIR/steps.txt"

if [[ $DRY == 1 ]]; then
    WORK="${BEVY_GPU_WORK:-$ROOT/build/gpu-check}"
    JOBS="${JOBS:-$(nproc)}"; CUDA=OFF; DEVICE=CPU
    MODEL_ARGS=(--layers 4 --experts 32 --top-k 4 --embd 256 --ff 256)
    BENCH_ARGS=(--repeats 1 --steps 16)
    BUILD_S=3000
else
    WORK="${BEVY_GPU_WORK:-/tmp/bevy-gpu-check}"
    JOBS="${JOBS:-$(nproc)}"; CUDA=ON; DEVICE="${DEVICE:-CUDA0}"
    MODEL_ARGS=(--preset qwen3-30b-a3b --layers 4)
    BENCH_ARGS=(--repeats 2 --steps 32)
    BUILD_S=560
fi
mkdir -p "$WORK"
PY="${PYTHON:-python3}"
[[ $DRY == 1 && -x "$WORK/venv/bin/python" ]] && PY="$WORK/venv/bin/python"
export PYTHONPATH="$WORK/site:$ROOT" PYTHONUNBUFFERED=1 BEVY_GGUF_BUILD_DIR="$WORK"
MODEL="$WORK/model.gguf"

# step NAME SECONDS LOG CMD...: run CMD with a time limit, its output appended to LOG, a line in steps.txt
step() {
    local name="$1" limit="$2" log="$3"
    shift 3
    local t0=$SECONDS
    echo "== $name: $*" >>"$log"
    timeout "$limit" bash -c '"$@"' step "$@" >>"$log" 2>&1  # bash -c: CMD may be a function of this script
    local rc=$?
    local why=ok
    [[ $rc == 124 ]] && why="timed out after ${limit} s"
    [[ $rc != 0 && $rc != 124 ]] && why="failed (exit $rc), see $(basename "$log")"
    echo "$name: $why in $((SECONDS - t0)) s" | tee -a "$STEPS"
    return $rc
}

site() {
    if [[ $DRY == 1 && ! -x "$WORK/venv/bin/python" ]]; then  # the GPU machine's packages, nothing else
        python3 -m venv "$WORK/venv" && "$WORK/venv/bin/python" -m pip install -q numpy tqdm matplotlib pyyaml \
            requests pytest jinja2 typing_extensions || return 1
        PY="$WORK/venv/bin/python"
    fi
    rm -rf "$WORK/site" && mkdir -p "$WORK/site" || return 1
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$BUNDLE"/wheels/*.whl || return 1
    tar -xzf "$BUNDLE/llama-pruned.tar.gz" -C "$WORK/site" --strip-components=1 --wildcards '*/llama_cpp/*'
}

build() {
    cmake -S "$ROOT" -B "$WORK/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBEVY_SRC_ROOT="$WORK/src" \
        -DBEVY_DIST="$WORK/dist" -DBEVY_JOBS="$JOBS" -DBEVY_CUDA="$CUDA" -DBEVY_CUDA_ARCHS="${CUDA_ARCHS:-90}" \
        -DBEVY_CUDA_FA="$([[ ${CUDA_FA:-0} == 1 ]] && echo ON || echo OFF)" --log-level=WARNING &&
        cmake --build "$WORK/cmake" -j "$JOBS"
}

export -f site build
export DRY WORK PY BUNDLE ROOT JOBS CUDA

if [[ $PHASE != bench ]]; then
    : >"$STEPS"
    [[ -f "$BUNDLE/llama-pruned.tar.gz" ]] || { echo "site: no bundle at $BUNDLE: run make gpu-bundle" | tee -a "$STEPS"; exit 1; }
    step site 300 "$OUTDIR/setup.log" site || exit 1
    [[ $DRY == 1 ]] && export PY="$WORK/venv/bin/python"
    step fetch 120 "$OUTDIR/setup.log" "$PY" scripts/fetch_llama.py --src "$WORK/src" \
        --pruned "$BUNDLE/llama-pruned.tar.gz" || exit 1
    step model "$BUILD_S" "$OUTDIR/model.log" "$PY" -m bevy_gguf.cli make-model "$MODEL" "${MODEL_ARGS[@]}" &
    MODEL_PID=$!
    step build "$BUILD_S" "$OUTDIR/build.log" build
    BUILD_RC=$?
    wait "$MODEL_PID"
    MODEL_RC=$?
    cat "$OUTDIR/model.log" >>"$OUTDIR/setup.log" && rm -f "$OUTDIR/model.log"
    if [[ $BUILD_RC != 0 ]]; then  # the log's end is what says why; keep it small enough to come back
        tail -c 4000000 "$OUTDIR/build.log" >"$OUTDIR/build.log.tail" && mv "$OUTDIR/build.log.tail" "$OUTDIR/build.log"
        exit 1
    fi
    [[ $MODEL_RC == 0 ]] || exit 1
    rm -f "$OUTDIR/build.log"  # built: the log says nothing the steps do not
fi
[[ $PHASE == build ]] && exit 0

"$PY" -m bevy_gguf.cli devices >>"$OUTDIR/setup.log" 2>&1
step tests 150 "$OUTDIR/bench.log" "$PY" -m pytest -q -p no:cacheprovider tests/e2e/test_cuda.py -rs
step bench 420 "$OUTDIR/bench.log" "$PY" -m bevy_gguf.cli bench "$MODEL" \
    --workload text --systems stock-resident,stock-offload,blocking,bevy-ctx,bevy --sweep cache=25%,50% --parallel 8 \
    -ngl 99 --device "$DEVICE" --link ram "${BENCH_ARGS[@]}" --out "$OUTDIR" || exit 1
rm -f "$OUTDIR/timeline.json"  # at most 8 files come back from a device call
echo "report: $OUTDIR/report.md" | tee -a "$STEPS"
