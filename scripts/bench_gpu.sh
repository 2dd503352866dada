#!/usr/bin/env bash
# Extraction speed on a CUDA GPU at Qwen2.5-VL-7B shapes (real architecture, random bf16 weights;
# no download): prints one JSON line with rows/s and model FLOP utilisation (MFU), then the CPU-
# comparable benchmark (naive full forward vs the project path) on the tiny backbone, on the GPU.
#   scripts/bench_gpu.sh [STEPS]          (default 16 steps x all surfaces' variants)
# Needs ../shared (trajectories, processor files). Set PEAK_TFLOPS for a GPU other than
# A100/H100/H200 to get the MFU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
STEPS=${1:-16}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
$PY -m ipi.tools.bench --gpu-7b-shapes --steps "$STEPS" ${PEAK_TFLOPS:+--peak-tflops "$PEAK_TFLOPS"} \
    --override backbone.batch_size=20 --override backbone.image_size.longest_edge=802816
$PY -m ipi.tools.bench --steps 4 --rss-steps '' --override extract.accelerator=gpu --override extract.precision=32-true
