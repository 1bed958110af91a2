#!/usr/bin/env bash
# Prepare what validate/run_gpu.sh needs on a GPU machine that cannot reach any package registry.
# Run here, from anywhere:   bash validate/fetch_wheels.sh [EXTRA_PACKAGE==VERSION ...]
#
# 1. Downloads wheels (Python 3.12, manylinux x86-64, no dependencies) into .whl/ at the repository
#    root: allocsim's pure-Python dependencies that the GPU image may lack (simpy, sortedcontainers,
#    tqdm), plus any names given as arguments. The GPU image already has numpy, pandas, pyarrow,
#    matplotlib, CuPy (cupy-cuda13x) and PyTorch; run_gpu.sh
#    installs a wheel only when `python3 -c "import X"` fails there.
# 2. Copies one real PyTorch snapshot from ../shared/traces (when present) into .gpu_traces/, so
#    that the GPU run validates a shared trace too (../shared does not travel to the GPU machine).
# Both folders are git-ignored; copy them to the GPU machine together with the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

mkdir -p .git/info
touch .git/info/exclude
for pattern in /.whl/ /.gpu_traces/; do
    grep -qxF "$pattern" .git/info/exclude || echo "$pattern" >> .git/info/exclude
done

PY=${PYTHON:-python3}
if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; fi

# Versions pinned to what this project's own environment runs (kept to one version of each).
PACKAGES=("simpy==4.1.2" "sortedcontainers==2.4.0" "tqdm==4.70.1" "$@")
mkdir -p .whl
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
    -d .whl "${PACKAGES[@]}"
echo "wheels in .whl/:"
ls -1 .whl
du -sh .whl

SNAPSHOT_DIR="$ROOT/../shared/traces/pytorch-snapshots"
SNAPSHOT=${GPU_SNAPSHOT:-Wedsonlin__medium_128_training_memory_snapshot.pickle}
if [ -f "$SNAPSHOT_DIR/$SNAPSHOT" ]; then
    mkdir -p .gpu_traces
    cp "$SNAPSHOT_DIR/$SNAPSHOT" .gpu_traces/
    echo "copied $SNAPSHOT into .gpu_traces/"
else
    echo "no shared snapshot at $SNAPSHOT_DIR/$SNAPSHOT (the GPU run will use the project's traces only)"
fi
