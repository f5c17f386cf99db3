#!/usr/bin/env bash
# The GPU check (CI stays on the CPU): run on a machine with one NVIDIA GPU, after README's
# set-up, in under 8 minutes.  1. the CUDA tests and the TF32 scoping; 2. the real-architecture
# parity suite with our side on CUDA against the recorded CPU references (ORT 1.19.2's
# numbers, same tolerances); 3. the GPU benchmark against eager PyTorch on the same GPU.
# The benchmark needs artifacts: make them on a machine with onnxruntime-training
# (`python scripts/benchmark.py --models ... --backends ort --rounds 1`, Python <= 3.11) and
# carry bench_out/ along; models without artifacts are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
OUT="${1:-gpu_check_out}"
mkdir -p "$OUT"
"$PY" - <<'PYCHECK'
import torch
assert torch.cuda.is_available(), "no CUDA device: this script checks a GPU machine"
print("GPU:", torch.cuda.get_device_name(0), "| torch", torch.__version__)
PYCHECK
"$PY" -m pytest -q tests/test_cuda.py tests/test_precision.py 2>&1 | tee "$OUT/cuda_tests.txt"
ORT_TORCH_COMPAT_TEST_DEVICE=cuda "$PY" -m pytest -q tests/test_real_architectures.py \
    -k "test_real_architecture_matches_its_anchor" 2>&1 | tee "$OUT/real_arch_cuda.txt"
MODELS=()
for model in mlp cnn transformer bert gpt2 vit lora; do
    [ -f "bench_out/$model/checkpoint" ] && MODELS+=("$model")
done
if [ "${#MODELS[@]}" -gt 0 ]; then
    "$PY" scripts/benchmark.py --device cuda --backends ours eager --models "${MODELS[@]}" --rounds 3 \
        --steps 30 --warmup 10 --json "$OUT/benchmark_cuda.json" 2>&1 | tail -n 30 | tee "$OUT/benchmark_cuda.txt"
else
    echo "no benchmark artifacts in bench_out/: benchmark skipped" | tee "$OUT/benchmark_cuda.txt"
fi
