#!/usr/bin/env bash
# The GPU check (CI stays on the CPU): run on a machine with one NVIDIA GPU, after README's
# set-up.  On one H100 its sections took (docs/gpu-check/; two runs): tests 15 s, parity 21 s
# with 4 pytest-xdist workers, the benchmark's bench size 5.6 min and its large size 1.6 min
# with four backends (one more than the default), making artifacts included: under 8 minutes.
#   1. the CUDA tests: TF32 scoping, CUDA vs CPU, CUDA graphs vs eager CUDA and the CPU;
#   2. the real-architecture parity suite with our side on CUDA (CUDA graphs on, the
#      default) against the recorded CPU references (ORT 1.19.2's numbers, same tolerances);
#      the log names every model whose steps fell back from CUDA graphs, and why;
#   3. the GPU benchmark: ours and the hand-written model in eager PyTorch and under
#      torch.compile, at the bench and compute-bound ("large": BERT-base-shaped, batch 32,
#      sequence 128) sizes (BENCH_SIZES="tiny bench large" adds the on-device sizes).  Artifacts are made on the spot (by
#      onnxruntime-training where installed, else by ort_torch_compat's generator).
# Usage: scripts/gpu_check.sh [OUT_DIR]; PYTHON picks the interpreter.  Environment knobs,
# for a part of the check: CHECKS ("tests parity benchmark", run in that order; benchmark:SIZE
# for one size), BENCH_SIZES ("tiny bench large"), BENCH_MODELS, BENCH_MODELS_TINY,
# BENCH_MODELS_LARGE (bert), BENCH_ROUNDS (2), BENCH_BACKENDS ("ours ours-eager eager
# compile"), BENCH_WORK (artifacts, made when missing), PARITY_WORKERS (pytest-xdist).
# Files in OUT_DIR: gpu_check.log (everything) and benchmark_cuda_<size>.json.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
OUT="${1:-gpu_check_out}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
export PYTHONUNBUFFERED=1
status=0

section() {  # section NAME SECONDS COMMAND...: run with a time limit, log, remember a failure
    local name=$1 limit=$2
    shift 2
    echo "=== $name ($(date -u +%H:%M:%S))" | tee -a "$LOG"
    timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
    local code=${PIPESTATUS[0]}
    echo "=== $name: exit $code" | tee -a "$LOG"
    [ "$code" -eq 0 ] || status=1
}

section gpu 60 "$PY" -c '
import torch
assert torch.cuda.is_available(), "no CUDA device: this script checks a GPU machine"
print("GPU:", torch.cuda.get_device_name(0), "| torch", torch.__version__, "| CUDA", torch.version.cuda)'

run_tests() {
    section cuda-tests 300 "$PY" -m pytest -q -p no:cacheprovider \
        tests/test_cuda.py tests/test_precision.py tests/test_cuda_graphs.py
}

run_parity() {
    # shellcheck disable=SC2086  (PARITY_WORKERS: pytest-xdist workers, where it is installed)
    section real-arch-cuda 400 env ORT_TORCH_COMPAT_TEST_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider \
        tests/test_real_architectures.py -k "test_real_architecture_matches_its_anchor" \
        ${PARITY_WORKERS:+-n $PARITY_WORKERS} -o log_cli=true --log-cli-level=WARNING
}

run_benchmark() {
    local size models
    for size in ${BENCH_SIZES:-bench large}; do
        models="${BENCH_MODELS:-mlp cnn transformer bert gpt2 vit lora}"
        [ "$size" = tiny ] && models="${BENCH_MODELS_TINY:-$models}"
        [ "$size" = large ] && models="${BENCH_MODELS_LARGE:-bert}"
        # shellcheck disable=SC2086  (word lists)
        section "benchmark-$size" 900 "$PY" scripts/benchmark.py --device cuda --size "$size" --models $models \
            --backends ${BENCH_BACKENDS:-ours eager compile} --rounds "${BENCH_ROUNDS:-1}" \
            --steps 50 --warmup 10 --work "${BENCH_WORK:-bench_out_cuda}" --json "$OUT/benchmark_cuda_$size.json"
    done
}

for check in ${CHECKS:-tests parity benchmark}; do
    case $check in
        benchmark:*) BENCH_SIZES=${check#benchmark:} run_benchmark ;;  # one size, e.g. benchmark:large
        *) "run_$check" ;;
    esac
done
exit $status
