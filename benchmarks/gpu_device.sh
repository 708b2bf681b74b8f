#!/usr/bin/env bash
# The GPU check on a CUDA machine without network access, from wheels brought along.
#
#   benchmarks/gpu_device.sh WHEELS_DIR [gpu_check.py arguments...]
#
# WHEELS_DIR (made by benchmarks/gpu_wheels.sh) holds, itself or in its folders, the
# onnxruntime-gpu wheel for this Python, split into pieces with
# `split -b 50M` (any prefix: `onnxruntime_gpu-...whl.part-aa`, or split's default
# `xaa`, `xab`...; a whole `onnxruntime_gpu-*.whl` is used as it is), and the wheels of
# skl2onnx and onnx-ad (and of any dependency this Python lacks). The script joins the
# pieces, replaces the installed onnxruntime by onnxruntime-gpu, installs skl2onnx and
# onnx-ad from WHEELS_DIR (--no-index), installs this project (--no-deps, editable) and
# runs benchmarks/gpu_check.py: the benchmark MLP on the CPU and on CUDA (standard
# backend), loss curves compared within 1e-3 with TF32 off, timings with TF32 off and
# on. Nothing is downloaded. PYTHON selects the interpreter (default: python3).
# RUN_TESTS=1 also runs tests/test_gpu.py where pytest is installed; JOIN_ONLY=1 stops
# after joining the wheel (a test of this script).
set -euo pipefail

WHEELS="${1:?usage: benchmarks/gpu_device.sh WHEELS_DIR [gpu_check.py arguments...]}"
shift
WHEELS="$(cd "$WHEELS" && pwd)"
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

echo "== $($PYTHON --version 2>&1), $(uname -m)"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
else
    echo "nvidia-smi not found"
fi

# 1. the onnxruntime-gpu wheel: whole, or joined from its pieces (sorted: split's suffixes)
# (in WHEELS or in its folders, one per call, as benchmarks/gpu_wheels.sh lays them out;
# the pieces sorted by their own names)
WHEEL="$(find "$WHEELS" -maxdepth 2 -name 'onnxruntime_gpu-*.whl' -type f | sort | tail -n 1)"
if [ -z "$WHEEL" ]; then
    mapfile -t PIECES < <(find "$WHEELS" -maxdepth 2 -type f \
        \( -name 'onnxruntime_gpu-*.whl?*' -o -name 'onnxruntime_gpu*.part*' -o -name 'x??' \) \
        -printf '%f\t%p\n' | sort | cut -f2)
    if [ "${#PIECES[@]}" -eq 0 ]; then
        echo "no onnxruntime_gpu wheel nor pieces of one in $WHEELS" >&2
        exit 2
    fi
    echo "== joining ${#PIECES[@]} pieces: ${PIECES[0]##*/} ... ${PIECES[-1]##*/}"
    cat "${PIECES[@]}" >"$WORK/joined.whl"
    # pip needs the wheel's own file name: read it from the wheel's metadata
    NAME="$("$PYTHON" - "$WORK/joined.whl" <<'EOF'
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as wheel:
    bad = wheel.testzip()
    if bad is not None:
        sys.exit(f"the joined wheel is corrupt (first bad member: {bad}): missing a piece?")
    info = next(n for n in wheel.namelist() if n.endswith(".dist-info/WHEEL"))
    dist, version = info.split("/")[0][: -len(".dist-info")].rsplit("-", 1)
    tags = [line.split(":", 1)[1].strip() for line in wheel.read(info).decode().splitlines()
            if line.startswith("Tag:")]
print(f"{dist}-{version}-{tags[0]}.whl")
EOF
)"
    WHEEL="$WORK/$NAME"
    mv "$WORK/joined.whl" "$WHEEL"
fi
echo "== wheel: ${WHEEL##*/}"
if [ "${JOIN_ONLY:-0}" = "1" ]; then  # for tests/test_gpu.py: stop before installing
    exit 0
fi

# 2. onnxruntime-gpu in place of the CPU build (both install the module onnxruntime)
"$PYTHON" -m pip uninstall -y onnxruntime
LINKS=(--find-links "$WHEELS")
for dir in "$WHEELS"/*/; do
    [ -d "$dir" ] && LINKS+=(--find-links "$dir")
done
"$PYTHON" -m pip install --no-index "${LINKS[@]}" "$WHEEL" skl2onnx onnx-ad

# 3. this project, without its dependencies (it would ask for the CPU build)
if ! "$PYTHON" -m pip install --no-index "${LINKS[@]}" --no-deps -e . ; then
    if ! "$PYTHON" -m pip install --no-build-isolation --no-deps -e . ; then
        echo "== could not install the project (no setuptools here?): using PYTHONPATH"
        export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    fi
fi
"$PYTHON" -c "import onnxruntime as o; print('== onnxruntime', o.__version__, o.get_available_providers())"

# 4. the check (exit status: that of gpu_check.py)
status=0
"$PYTHON" benchmarks/gpu_check.py "$@" || status=$?
if [ "${RUN_TESTS:-0}" = "1" ] && "$PYTHON" -c "import pytest" 2>/dev/null; then
    "$PYTHON" -m pytest -q tests/test_gpu.py || status=$?
fi
exit "$status"
