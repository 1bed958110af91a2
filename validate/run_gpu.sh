#!/usr/bin/env bash
# The whole GPU validation in one prepared run, for a machine with an NVIDIA GPU, CuPy and (optionally)
# PyTorch, and no package registry. From the repository root:
#
#     bash validate/fetch_wheels.sh          # here, once: wheels into .whl/, a shared snapshot into .gpu_traces/
#     bash validate/run_gpu.sh               # there: results into $OUT (or validate/results/gpu)
#
# .whl/ and .gpu_traces/ are git-ignored: copy them to the GPU machine with the tree. Expected: 4-6 minutes.
#
# Steps, each under its own time limit inside an overall budget (BUDGET_S, default 450 s); a failed or
# timed-out step is logged and the script goes on to the next one:
#   0. install allocsim's missing pure-Python dependencies from .whl/ (only those `import` cannot find)
#   1. describe the machine (nvidia-smi, CuPy, PyTorch)
#   2. python -m validate calibrate --backend cupy          -> calibration.json
#   3. capture a real CuPy workload (a few MLP training steps) with allocsim.capture.capture_cupy
#                                                              -> captured_mlp.parquet (+ a report section)
#   4. replay traces/bert_fp32.json.gz: policies direct, pytorch, cupy, cuda-async, paddle, deferred-gc
#      and the real allocators (CuPy MemoryPool / MemoryAsyncPool, PyTorch) against their presets
#   5. the same with --compute (spin kernels for the trace's gaps, time scale 0.25) for a few policies
#   6. a shared PyTorch snapshot copied into .gpu_traces/ (if any), policies and real allocators
#   7. the captured trace, policies and real allocators
#   8. merge everything into report.md + results.json; 9. the GPU-marked tests, if time is left
# Files in the output folder (kept to five): report.md, results.json,
# calibration.json, captured_mlp.parquet, log.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT_DIR=${OUT:-$ROOT/validate/results/gpu}
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d /tmp/allocsim_gpu.XXXXXX)
LOG="$OUT_DIR/log.txt"
: > "$LOG"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
BACKEND=${BACKEND:-cupy}     # BACKEND=host runs the same steps on host memory (to check this script without a GPU)
START=$(date +%s)
DEADLINE=$(( START + ${BUDGET_S:-450} ))
FAILED=()

log() { echo "[$(date +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }

# step NAME LIMIT_S COMMAND...: run under `timeout`, output into the log; never stops the script.
step() {
    local name=$1 limit=$2
    shift 2
    local left=$(( DEADLINE - $(date +%s) ))
    if (( left < 20 )); then
        log "SKIP  $name: the time budget is spent"
        FAILED+=("$name(skipped)")
        return 0
    fi
    if (( limit > left )); then limit=$left; fi
    log "START $name (limit ${limit}s)"
    local rc=0
    timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1 || rc=$?
    if (( rc == 0 )); then
        log "OK    $name"
    else
        log "FAIL  $name (exit $rc$( (( rc == 124 || rc == 137 )) && echo ', timed out'))"
        FAILED+=("$name")
    fi
    return 0
}

# ---------------------------------------------------------------- 0. dependencies
install_missing() {
    local files=() mod pkg
    for pair in simpy:simpy sortedcontainers:sortedcontainers tqdm:tqdm; do
        mod=${pair%%:*}
        pkg=${pair##*:}
        if ! "$PY" -c "import $mod" >/dev/null 2>&1; then
            local whl
            whl=$(ls "$ROOT"/.whl/"$pkg"-*.whl 2>/dev/null | head -n 1 || true)
            if [ -n "$whl" ]; then files+=("$whl"); else log "missing $mod and no wheel for it in .whl/"; fi
        fi
    done
    if (( ${#files[@]} )); then
        log "installing from .whl/: ${files[*]##*/}"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            "${files[@]}" >>"$LOG" 2>&1 || log "pip install failed (see log)"
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
    export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
    for mod in numpy pandas pyarrow simpy sortedcontainers cupy allocsim validate; do
        "$PY" -c "import $mod" >/dev/null 2>&1 || log "WARNING: python cannot import $mod"
    done
}
log "allocsim GPU validation; output in $OUT_DIR; work dir $WORK"
install_missing

# ---------------------------------------------------------------- 1. machine
cat > "$WORK/machine.py" <<'EOF'
import sys
print("python", sys.version)
import numpy
print("numpy", numpy.__version__)
try:
    import cupy
    rt = cupy.cuda.runtime
    p = rt.getDeviceProperties(0)
    print("cupy", cupy.__version__, "gpu", p["name"], p["totalGlobalMem"], "driver", rt.driverGetVersion(),
          "runtime", rt.runtimeGetVersion())
except Exception as exc:
    print("cupy unavailable:", type(exc).__name__, exc)
try:
    import torch
    print("torch", torch.__version__, "cuda available:", torch.cuda.is_available())
except Exception as exc:
    print("torch unavailable:", type(exc).__name__, exc)
EOF
step machine 60 bash -c "nvidia-smi || true; \"$PY\" \"$WORK/machine.py\""

# ---------------------------------------------------------------- 2. calibration
CAL="$OUT_DIR/calibration.json"
step calibrate 150 "$PY" -m validate calibrate --backend "$BACKEND" -o "$CAL"
COST=()
if [ -s "$CAL" ]; then COST=(--cost-model "$CAL"); else log "no calibration file: replays use the default cost model"; fi

# ---------------------------------------------------------------- 3. capture a real CuPy workload
CAPTURED="$OUT_DIR/captured_mlp.parquet"
cat > "$WORK/capture_mlp.py" <<'EOF'
"""A few MLP training steps in plain CuPy, captured with allocsim.capture.capture_cupy (hook mode).

Afterwards the real MemoryPool's own cudaMallocs during the capture (the hook's alloc events) are
compared with what the `cupy` preset predicts for the captured trace: the most direct check of the
preset against the real pool, on a real workload.
"""
import sys
import time

import cupy as cp

from allocsim.capture import capture_cupy
from allocsim.device import SimulatedDevice
from allocsim.engine import run_fast
from allocsim.policies.registry import build_policy

out, section = sys.argv[1], sys.argv[2]
cp.random.seed(0)
dims = [1024, 4096, 4096, 1024]
batch, steps = 512, 6
ws = [cp.random.randn(a, b, dtype=cp.float32) * (1.0 / a ** 0.5) for a, b in zip(dims, dims[1:])]
side = cp.cuda.Stream(non_blocking=True)
(ws[0][:8] @ ws[1][:, :8]).sum()              # cuBLAS handle and workspace before the capture
cp.cuda.Device().synchronize()
pool = cp.get_default_memory_pool()
pool.free_all_blocks()                          # only the live weights stay in the pool
total_before = pool.total_bytes()
t0 = time.perf_counter()
with capture_cupy(out, mode="hook") as cap:
    for step in range(steps):
        with side:                              # the "data loader" works on a second stream
            x = cp.random.randn(batch, dims[0], dtype=cp.float32)
            target = cp.random.randn(batch, dims[-1], dtype=cp.float32)
        side.synchronize()
        acts, pre = [x], []
        for i, w in enumerate(ws):
            z = acts[-1] @ w
            pre.append(z)
            acts.append(cp.maximum(z, 0) if i < len(ws) - 1 else z)
        grad = 2.0 * (acts[-1] - target) / batch
        loss = float((grad * grad).sum())
        for i in reversed(range(len(ws))):
            gw = acts[i].T @ grad
            if i:
                grad = (grad @ ws[i].T) * (pre[i - 1] > 0)
            ws[i] -= 1e-3 * gw
            del gw
        del acts, pre, grad, x, target, z
    cp.cuda.Device().synchronize()
seconds = time.perf_counter() - t0
trace = cap.trace
real_segments = trace.decisions.loc[trace.decisions["action"] == "segment_alloc", "size_bytes"]
real_growth = pool.total_bytes() - total_before
dev = SimulatedDevice(None)
policy = build_policy("cupy", device=dev)
peak = [0]
run_fast(trace, policy, observer=lambda _i, p: peak.__setitem__(0, max(peak[0], p.segment_bytes())))
pred_growth, pred_mallocs = peak[0], dev.n_mallocs
err = (pred_growth - real_growth) / real_growth * 100 if real_growth else float("nan")
lines = [
    "## Captured CuPy workload: the `cupy` preset against the real MemoryPool",
    "",
    f"{steps} training steps of a {'-'.join(map(str, dims))} MLP (batch {batch}, fp32, inputs made on a second "
    f"stream), captured with `allocsim.capture.capture_cupy(mode='hook')` in {seconds:.2f} s: "
    f"{cap.n_allocs} allocations, {cap.n_frees} frees, {len(set(trace.column('stream').tolist()))} streams. "
    "The pool's own cudaMallocs during the capture come from the hook's `alloc` events.",
    "",
    "| | real MemoryPool | `cupy` preset (simulated) | error |",
    "|---|---:|---:|---:|",
    f"| pool cudaMallocs | {len(real_segments):,} | {pred_mallocs:,} | "
    f"{(pred_mallocs - len(real_segments)) / max(len(real_segments), 1) * 100:+.2f} % |",
    f"| pool growth (total_bytes) B | {real_growth:,} | {pred_growth:,} | {err:+.2f} % |",
    "",
]
open(section, "w").write("\n".join(lines))
print("\n".join(lines))
EOF
if "$PY" -c "import cupy; cupy.cuda.runtime.getDeviceCount()" >/dev/null 2>&1; then
    step capture 90 "$PY" "$WORK/capture_mlp.py" "$CAPTURED" "$WORK/capture.md"
else
    log "SKIP  capture: CuPy or its GPU is not available"
fi

# ---------------------------------------------------------------- 4-7. replays
POLICIES=direct,pytorch,cupy,cuda-async,paddle,deferred-gc
step replay-bert 150 "$PY" -m validate replay traces/bert_fp32.json.gz --backend "$BACKEND" --policy "$POLICIES" \
    --real all ${COST[@]+"${COST[@]}"} -o "$WORK/bert"
step replay-bert-compute 120 "$PY" -m validate replay traces/bert_fp32.json.gz --backend "$BACKEND" \
    --policy direct,pytorch,cupy --compute --time-scale 0.25 ${COST[@]+"${COST[@]}"} -o "$WORK/bert_compute"
SNAP=$(ls "$ROOT"/.gpu_traces/*.pickle "$ROOT"/shared/traces/pytorch-snapshots/*.pickle 2>/dev/null | head -n 1 || true)
if [ -n "$SNAP" ]; then
    step replay-snapshot 120 "$PY" -m validate replay "$SNAP" --backend "$BACKEND" --policy "$POLICIES" --real all \
        ${COST[@]+"${COST[@]}"} -o "$WORK/snapshot"
else
    log "SKIP  replay-snapshot: no snapshot in .gpu_traces/ (run validate/fetch_wheels.sh here first)"
fi
if [ -s "$CAPTURED" ]; then
    step replay-captured 90 "$PY" -m validate replay "$CAPTURED" --backend "$BACKEND" --policy direct,cupy,pytorch \
        --real cupy-pool,torch ${COST[@]+"${COST[@]}"} -o "$WORK/captured"
fi

# ---------------------------------------------------------------- 8. one report
NOTE="GPU run of validate/run_gpu.sh on $(date -u +%Y-%m-%dT%H:%MZ); steps that failed or were skipped: "
NOTE+="${FAILED[*]:-none}. Full log: log.txt."
SECTIONS=()
if [ -s "$WORK/capture.md" ]; then SECTIONS=(--section-file "$WORK/capture.md"); fi
DEADLINE=$(( DEADLINE + 30 ))   # merging is cheap and must happen
step report 30 "$PY" -m validate.report merge "$WORK/bert" "$WORK/bert_compute" "$WORK/snapshot" \
    "$WORK/captured" -o "$OUT_DIR" --calibration "$CAL" --title "GPU (CuPy) predicted vs measured" \
    --note "$NOTE" ${SECTIONS[@]+"${SECTIONS[@]}"}

# ---------------------------------------------------------------- 9. GPU-marked tests
if "$PY" -c "import pytest, hypothesis" >/dev/null 2>&1; then
    step gpu-tests 90 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/test_validate_host.py tests/test_capture.py
fi

log "done in $(( $(date +%s) - START )) s; failed or skipped: ${FAILED[*]:-none}"
ls -la "$OUT_DIR" | tee -a "$LOG"
if [ -s "$OUT_DIR/report.md" ]; then cat "$OUT_DIR/report.md"; fi
exit 0
