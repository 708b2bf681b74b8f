#!/usr/bin/env bash
# The wheels that benchmarks/gpu_device.sh installs on the lent CUDA machine, which has
# no network and takes at most 64 MiB per call (working tree included).
#
#   benchmarks/gpu_wheels.sh OUT_DIR
#
# Writes OUT_DIR/small (skl2onnx and onnx-ad, pure Python) and OUT_DIR/p1, p2, ...: the
# onnxruntime-gpu wheel for CPython 3.12 on x86-64 Linux split into pieces of PIECE_SIZE
# (split's -b, default 45M), one piece per folder, so that each folder travels in a call of its
# own (`run` with carry=["OUT_DIR/p1"], then p2, ..., the machine kept warm between
# them); the last call carries OUT_DIR/small and runs
# `bash benchmarks/gpu_device.sh OUT_DIR`, which joins the pieces again.
#
# ORT_GPU_VERSION picks the onnxruntime-gpu release (default 1.31.1: CUDA 13, cuDNN 9);
# WHEEL=path splits a wheel already downloaded instead (no download at all, as the
# tests run it); PYTHON is the interpreter whose pip downloads (default: python3).
set -euo pipefail

OUT="${1:?usage: benchmarks/gpu_wheels.sh OUT_DIR}"
PYTHON="${PYTHON:-python3}"
PIECE_SIZE="${PIECE_SIZE:-45M}"
mkdir -p "$OUT/small"
OUT="$(cd "$OUT" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

WHEEL="${WHEEL:-}"
if [ -z "$WHEEL" ]; then
    "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        -d "$WORK" "onnxruntime-gpu==${ORT_GPU_VERSION:-1.31.1}"
    WHEEL="$(find "$WORK" -maxdepth 1 -name 'onnxruntime_gpu-*.whl' | head -n 1)"
    "$PYTHON" -m pip download --no-deps --only-binary=:all: -d "$OUT/small" \
        "skl2onnx>=1.17" "onnx-ad~=0.3.0"
fi
NAME="$(basename "$WHEEL")"
rm -rf "$OUT"/p[0-9]*
split -b "$PIECE_SIZE" -d -a 2 "$WHEEL" "$WORK/$NAME."
k=0
for piece in "$WORK/$NAME".[0-9][0-9]; do
    k=$((k + 1))
    mkdir -p "$OUT/p$k"
    mv "$piece" "$OUT/p$k/"
done
echo "$NAME: $k pieces of at most $PIECE_SIZE in $OUT/p1 ... $OUT/p$k; skl2onnx and onnx-ad in $OUT/small"
