#!/usr/bin/env bash
# One prepared check for a machine with an NVIDIA GPU and maybe no network: a 3-stage
# chain on the GPU against the CPU chain (greedy tokens equal?), tok/s and VRAM per stage.
# Carry the repository and a venv holding the engine wheel built with a GPU backend
# (`make engine-wheel ENGINE_GPU="--gpu vulkan"` or `make engine-wheel-cuda`). Exit 0 only
# when the tokens are equal and every stage runs on the GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${SANGAMA_PY:-.venv/bin/python}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
"$PY" -c "import llama_cpp, gguf, numpy" || { echo "venv at $PY lacks the engine"; exit 2; }
"$(dirname "$PY")/sangama" hardware || true
"$PY" bench/gpu_check.py --model "${SANGAMA_GPU_CHECK_MODEL:-default}" "$@"
