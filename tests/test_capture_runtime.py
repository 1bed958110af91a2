"""``allocsim capture`` runs real scripts as a GPU would: torch-only interpreters, autocast, the torch.cuda API,
categories, cuBLAS workspaces per thread, threads, fork, and an honest account of how the script ended.

Every expected byte count below follows from shapes and PyTorch's CUDA rules (float32 = 4 bytes,
bfloat16 = 2; one cuBLAS workspace of ``:4096:2:16:8`` = 8 MiB + 128 KiB per thread and stream
before Hopper, 32 MiB on Hopper). CI installs torch (CPU build), so none of these skip there.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from importlib import util as import_util
from pathlib import Path

import pytest

if os.environ.get("CI"):
    import torch  # noqa: F401  (CI installs it: a missing torch must fail, not skip)
else:
    pytest.importorskip("torch")

from allocsim.metrics.categories import CATEGORIES, categorize  # noqa: E402
from allocsim.trace import read_trace  # noqa: E402
from allocsim.trace.schema import EventKind  # noqa: E402
from allocsim.torch_capture import session  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CUBLAS_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_HOPPER_BYTES = 32 << 20

pytestmark = pytest.mark.full      # each test starts a capture child (seconds)


def _write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def _capture(script: Path, out: Path, python: str | None = None, **kwargs):
    result, _trace = session.capture([python or sys.executable, str(script)], str(out), **kwargs)
    return result, (read_trace(str(out)) if result.trace_path else None)


def _kept(folder: Path, path: Path) -> Path:
    """Where ``--keep-writes folder`` holds the script's version of ``path`` (its writes never reach ``path``)."""
    return folder / "files" / str(path).lstrip("/")


def _allocs(trace) -> list[int]:
    ev = trace.events
    return ev[ev["kind"] == int(EventKind.ALLOC)]["size_bytes"].tolist()


def _torch_only_python(folder: Path) -> str:
    """An interpreter that sees torch and what torch needs, and nothing else (no numpy, pandas, pyarrow, msgspec)."""
    site = folder / "site"
    site.mkdir()
    from importlib.metadata import packages_distributions, requires

    wanted, todo = set(), ["torch"]
    while todo:                        # torch and what it requires, recursively (but not its extras)
        dist = todo.pop().lower().replace("_", "-")
        if dist in wanted:
            continue
        wanted.add(dist)
        for req in requires(dist) or []:
            if "extra ==" not in req:
                todo.append(req.split(";")[0].split("[")[0].split(">")[0].split("<")[0].split("=")[0].split("!")[0]
                            .split("~")[0].strip())
    names = {top for top, dists in packages_distributions().items()
             if any(d.lower().replace("_", "-") in wanted for d in dists) and not top.startswith("_")}
    for name in sorted(names):
        spec = import_util.find_spec(name)
        if spec is None or spec.origin in (None, "built-in"):
            continue
        location = Path(spec.submodule_search_locations[0]) if spec.submodule_search_locations else Path(spec.origin)
        (site / location.name).symlink_to(location)
    wrapper = folder / "python-torch-only"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" -S "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_a_profiling_script_runs_in_an_interpreter_with_torch_and_nothing_else(tmp_path):
    python = _torch_only_python(tmp_path)
    for module in ("numpy", "pandas", "pyarrow", "msgspec"):
        check = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
        assert check.returncode != 0, f"{module} is importable: the test would prove nothing"
    script = _write(tmp_path, "profiling_step.py", """
        import json, torch
        torch.cuda.memory._record_memory_history(max_entries=100000)
        torch.cuda.cudart().cudaProfilerStart()
        torch.cuda.nvtx.range_push("model")
        model = torch.nn.Linear(256, 256).cuda()
        torch.cuda.nvtx.range_pop()
        props = torch.cuda.get_device_properties(0)
        assert torch.cuda.is_bf16_supported()
        side = torch.cuda.Stream()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.cuda.nvtx.range("step"), torch.autocast("cuda", dtype=torch.bfloat16):
            y = model(torch.randn(32, 256, device="cuda"))
        with torch.cuda.stream(side):
            z = torch.empty(1000, device="cuda")
        end.record(); torch.cuda.synchronize()
        figures = {"allocated": torch.cuda.memory_allocated(), "peak": torch.cuda.max_memory_allocated(),
                   "reserved": torch.cuda.memory_reserved(), "name": props.name, "dtype": str(y.dtype),
                   "total": props.total_memory, "elapsed": start.elapsed_time(end), "sm": props.multi_processor_count}
        torch.cuda.memory._dump_snapshot("snap.pickle")
        torch.cuda.cudart().cudaProfilerStop()
        json.dump(figures, open("figures.json", "w"))
        """)
    os.chdir(tmp_path)
    result, trace = _capture(script, tmp_path / "p.parquet", python=python, gpu={"name": "H100", "major": 9,
                                                                                 "minor": 0, "sm_count": 132,
                                                                                 "total_bytes": 85018279936},
                             keep_writes=str(tmp_path / "kept"))
    assert result.status == 0, result.message
    assert not (tmp_path / "figures.json").exists()                 # the script's file went to the scratch folder
    figures = json.loads(_kept(tmp_path / "kept", tmp_path / "figures.json").read_text())
    assert figures["name"] == "H100" and figures["total"] == 85018279936 and figures["sm"] == 132
    assert figures["dtype"] == "torch.bfloat16"                     # autocast ran the linear in bf16
    # block bytes, as the GPU reports them: the requests live when the script asked, each rounded up to 512 B
    sizes = _allocs(trace)
    assert CUBLAS_HOPPER_BYTES in sizes                             # Hopper's workspace for the forward thread
    live = sum(-(-s // 512) * 512 for s in _live_sizes_at(trace, "memory snapshot snap.pickle"))
    assert figures["allocated"] == live and figures["peak"] >= live
    assert figures["reserved"] >= figures["allocated"] and figures["reserved"] % (2 << 20) == 0
    labels = [trace.labels[int(i)] for i, k in zip(trace.events["alloc_id"], trace.events["kind"])
              if k == int(EventKind.MARKER)]
    assert "memory_history start max_entries=100000" in labels and "memory snapshot snap.pickle" in labels
    assert not (tmp_path / "snap.pickle").exists()                  # the snapshot is a marker, not a file
    # the side stream's request is on its own stream
    ev = trace.events
    assert int(ev[(ev["kind"] == int(EventKind.ALLOC)) & (ev["size_bytes"] == 4000)]["stream"].iloc[0]) != 0


def _live_sizes_at(trace, label: str) -> list[int]:
    """Sizes of the requests live when the marker ``label`` was recorded."""
    live: dict[int, int] = {}
    ev = trace.events
    for kind, alloc_id, size in zip(ev["kind"], ev["alloc_id"], ev["size_bytes"]):
        if kind == int(EventKind.ALLOC):
            live[int(alloc_id)] = int(size)
        elif kind == int(EventKind.FREE_REQUESTED):
            live.pop(int(alloc_id), None)
        elif kind == int(EventKind.MARKER) and trace.labels[int(alloc_id)] == label:
            return list(live.values())
    raise AssertionError(f"no marker {label!r}")


def test_autocast_casts_inputs_caches_the_weight_copy_and_frees_it_when_the_block_ends(tmp_path):
    script = _write(tmp_path, "amp.py", """
        import torch
        lin = torch.nn.Linear(1024, 512, bias=False).cuda()
        x = torch.randn(64, 1024, device="cuda")
        with torch.no_grad():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = lin(x)
                z = lin(x)
                s = torch.softmax(y, -1)
            del y, z, s
            torch.cuda.memory._record_memory_history()
        """)
    result, trace = _capture(script, tmp_path / "amp.parquet")
    assert result.status == 0, result.message
    weight, x, x_bf16, w_bf16, out_bf16 = 512 * 1024 * 4, 64 * 1024 * 4, 64 * 1024 * 2, 512 * 1024 * 2, 64 * 512 * 2
    assert _allocs(trace) == [weight, x, x_bf16, w_bf16, out_bf16, CUBLAS_BYTES,
                              x_bf16, out_bf16,             # the input is cast again, the weight comes from the cache
                              64 * 512 * 4, 64 * 512 * 4]   # softmax runs in float32 (autocast's fp32 list): a
    #                                                         float copy of the bf16 input, then the output
    ev = trace.events
    kinds, ids = ev["kind"].tolist(), ev["alloc_id"].tolist()
    marker = kinds.index(int(EventKind.MARKER), 1)
    w_id = ids[[i for i, k in enumerate(kinds) if k == int(EventKind.ALLOC)][3]]
    freed_at = [i for i, (k, a) in enumerate(zip(kinds, ids)) if k == int(EventKind.FREE_REQUESTED) and a == w_id]
    assert freed_at and freed_at[0] < marker          # the cached bf16 weight goes when the outermost block exits


def test_float16_softmax_to_float32_takes_cudas_fused_kernel(tmp_path):
    """SoftMax.cpp: a CUDA half input asked for float output runs _softmax(half_to_float=True), with no copy."""
    script = _write(tmp_path, "sm.py", """
        import torch
        x = torch.empty(64, 512, device="cuda", dtype=torch.float16)
        a = torch.softmax(x, -1, dtype=torch.float32)
        with torch.autocast("cuda", dtype=torch.float16):
            b = torch.log_softmax(x, -1)
        """)
    result, trace = _capture(script, tmp_path / "sm.parquet")
    assert result.status == 0, result.message
    assert _allocs(trace) == [64 * 512 * 2, 64 * 512 * 4, 64 * 512 * 4]


def test_categories_are_what_the_script_made(tmp_path):
    script = _write(tmp_path, "mlp.py", """
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).cuda()
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(2):
            loss = model(torch.randn(32, 512).cuda()).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        """)
    result, trace = _capture(script, tmp_path / "mlp.parquet")
    assert result.status == 0, result.message
    param_bytes = (512 * 1024 + 1024 + 1024 * 256 + 256) * 4
    ev = trace.events
    allocs = ev[ev["kind"] == int(EventKind.ALLOC)]
    cats = categorize(trace)
    by = cats.split(allocs["alloc_id"].to_numpy(), allocs["size_bytes"].to_numpy())
    assert by["parameter"] == param_bytes
    assert by["gradient"] == 2 * param_bytes                      # set to None after each of the 2 steps
    assert by["optimizer_state"] == 2 * param_bytes               # exp_avg, exp_avg_sq (step counts stay on the host)
    assert by["workspace"] == 2 * CUBLAS_BYTES                    # the script's thread and the autograd engine's
    assert set(by) == set(CATEGORIES)
    assert any(r["rule"].startswith("named by allocsim capture") for r in cats.rules)


def test_gradients_accumulate_in_place_as_on_the_gpu(tmp_path):
    """input_buffer.cpp: the engine adds a second gradient into the first in place when it holds the only reference."""
    script = _write(tmp_path, "acc.py", """
        import torch
        x = torch.randn(256, 1024, device="cuda", requires_grad=True)
        a = x.exp()
        ((a * 2).sum() + (a * 3).sum()).backward()
        """)
    result, trace = _capture(script, tmp_path / "acc.parquet")
    assert result.status == 0, result.message
    ev = trace.events
    stacks = [trace.stack(int(sid)) for sid in ev[ev["kind"] == int(EventKind.ALLOC)]["stack_id"]]
    backward = [s[0][2] for s in stacks if any("evaluate_function" in f[2] for f in s)]
    assert backward == ["aten::mul.Tensor", "aten::mul.Tensor", "aten::mul.Tensor"]   # grad*2, grad*3, exp's
    # and no aten::add.Tensor: the sum of a's two gradients is written into the first one's block


def test_a_forward_only_run_binds_one_cublas_workspace(tmp_path):
    script = _write(tmp_path, "fwd.py", """
        import torch
        model = torch.nn.Linear(64, 64).cuda()
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(8, 64, device="cuda"))
        """)
    result, trace = _capture(script, tmp_path / "fwd.parquet")
    assert result.status == 0
    assert _allocs(trace).count(CUBLAS_BYTES) == 1


def test_a_checkpoint_loaded_to_cuda_is_copied_to_the_device(tmp_path):
    import torch

    torch.save({"w": torch.zeros(1024, 2048), "step": torch.tensor(3)}, tmp_path / "ckpt.pt")
    script = _write(tmp_path, "load.py", f"""
        import torch
        sd = torch.load({str(tmp_path / "ckpt.pt")!r}, map_location="cuda")
        assert sd["w"].is_cuda and sd["w"].shape == (1024, 2048)
        host = torch.load({str(tmp_path / "ckpt.pt")!r}, map_location="cpu")
        assert not host["w"].is_cuda
        """)
    result, trace = _capture(script, tmp_path / "load.parquet")
    assert result.status == 0, result.message
    assert _allocs(trace) == [1024 * 2048 * 4, 8]      # each tensor once, to the device; the host load takes none


def test_torch_compile_runs_eager_and_says_so(tmp_path):
    script = _write(tmp_path, "comp.py", """
        import torch
        model = torch.compile(torch.nn.Linear(64, 64).cuda())
        @torch.compile(mode="max-autotune")
        def double(x):
            return x * 2
        double(model(torch.randn(8, 64, device="cuda")))
        """)
    result, trace = _capture(script, tmp_path / "comp.parquet")
    assert result.status == 0, result.message
    assert 8 * 64 * 4 in _allocs(trace)
    assert any("torch.compile ran eager" in note for note in trace.meta.notes)


def test_cuda_work_in_a_thread_is_captured(tmp_path):
    script = _write(tmp_path, "thread.py", """
        import threading, torch
        def work():
            global kept
            kept = torch.empty(12345, dtype=torch.uint8, device="cuda")
        t = threading.Thread(target=work); t.start(); t.join()
        """)
    result, trace = _capture(script, tmp_path / "thread.parquet")
    assert result.status == 0
    assert 12345 in _allocs(trace)


def test_a_forked_process_does_not_write_into_the_trace(tmp_path):
    script = _write(tmp_path, "fork.py", """
        import os, torch
        a = torch.empty(1111, dtype=torch.uint8, device="cuda")
        pid = os.fork()
        if pid == 0:
            b = torch.empty(2222, dtype=torch.uint8, device="cuda")
            os._exit(0)
        os.waitpid(pid, 0)
        c = torch.empty(3333, dtype=torch.uint8, device="cuda")
        """)
    result, trace = _capture(script, tmp_path / "fork.parquet")
    assert result.status == 0
    assert _allocs(trace) == [1111, 3333]


@pytest.mark.parametrize("last_line", ['{"trace": "x", "allocs": 123456789, "peak_allocated_bytes": 1e18}',
                                       '{"not": "a summary"}'])
def test_what_the_script_prints_is_never_taken_for_the_capture_summary(tmp_path, last_line):
    script = _write(tmp_path, "loud.py", f"""
        import sys, torch
        x = torch.empty(100, device="cuda")
        print({last_line!r}, file=sys.stderr)
        """)
    result, trace = _capture(script, tmp_path / "loud.parquet")
    assert result.status == 0 and result.summary["allocs"] == 1 and _allocs(trace) == [400]


def test_os_exit_keeps_what_was_recorded(tmp_path):
    script = _write(tmp_path, "quit.py", """
        import os, torch
        x = torch.empty(100, device="cuda")
        os._exit(0)
        """)
    result, trace = _capture(script, tmp_path / "quit.parquet")
    assert result.status == 0 and _allocs(trace) == [400]


def test_timeout_interrupts_the_script_and_keeps_the_partial_trace(tmp_path):
    script = _write(tmp_path, "loop.py", """
        import time, torch
        x = torch.empty(100, device="cuda")
        while True:
            time.sleep(0.05)
        """)
    result, trace = _capture(script, tmp_path / "loop.parquet", timeout_s=8)
    assert result.status == session.EXIT_TIMEOUT
    assert _allocs(trace) == [400]
    assert any("--timeout" in note for note in trace.meta.notes)


def test_ctrl_c_gives_the_partial_trace_and_exit_130(tmp_path):
    script = _write(tmp_path, "wait.py", """
        import time, torch
        x = torch.empty(100, device="cuda")
        open("ready", "w").close()
        while True:
            time.sleep(0.05)
        """)
    out = tmp_path / "wait.parquet"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "allocsim", "capture", "-o", str(out), "--keep-writes",
                             str(tmp_path / "kept"), "--", sys.executable, str(script)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not _kept(tmp_path / "kept", tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)            # what Ctrl-C does: the whole foreground group
    _stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert _allocs(read_trace(str(out))) == [400]


def test_a_bad_output_is_refused_before_the_script_runs(tmp_path):
    script = _write(tmp_path, "s.py", "open('ran', 'w').close()\n")
    (tmp_path / "notes.txt").write_text("my notes\n")
    for output in (str(tmp_path / "missing" / "t.parquet"), str(tmp_path / "notes.txt"), str(tmp_path / "t.txt")):
        done = subprocess.run([sys.executable, "-m", "allocsim", "capture", "-o", output, "--", sys.executable,
                               str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "ran").exists()
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"


def test_a_relative_output_is_where_the_user_was_not_where_the_script_went(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    script = _write(tmp_path, "cd.py", """
        import os, torch
        os.chdir("elsewhere")
        x = torch.empty(100, device="cuda")
        """)
    done = subprocess.run([sys.executable, "-m", "allocsim", "capture", "-o", "t.parquet", "--", sys.executable,
                           str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "t.parquet").exists() and not (tmp_path / "elsewhere" / "t.parquet").exists()


def test_an_interpreter_without_torch_is_named(tmp_path):
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S -I "$@"\n')
    bare.chmod(0o755)
    script = _write(tmp_path, "s.py", "import torch\n")
    done = subprocess.run([sys.executable, "-m", "allocsim", "capture", "-o", str(tmp_path / "t.parquet"), "--",
                           str(bare), str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert str(bare) in done.stderr and "torch" in done.stderr and "Traceback" not in done.stderr


def test_a_model_built_on_the_cpu_is_never_materialised(tmp_path):
    """A 2.7B-parameter model (10.6 GB in float32) built on the CPU, moved to cuda, one AdamW step: small RSS."""
    probe = _write(tmp_path, "probe.py", f"""
        import resource, sys
        sys.path.insert(0, {str(REPO)!r})
        from allocsim.torch_capture import session
        result, trace = session.capture([sys.executable, {str(REPO / "benchmarks" / "decoder_train.py")!r},
                                         "--config", "2.7b", "--seq", "128"], {str(tmp_path / "big.parquet")!r},
                                        steps=1, write=False)
        print(result.status, result.summary["peak_allocated_bytes"],
              resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
        """)
    done = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    status, peak_allocated, child_rss = (int(v) for v in done.stdout.split()[-3:])
    d, d_ff, layers, vocab = 2560, 10240, 32, 50257
    params = layers * (4 * d * d + 2 * d * d_ff + 2 * d) + 2 * vocab * d + d      # 2,774,064,640
    assert status == 0
    assert peak_allocated > 4 * 4 * params * 0.99           # parameters, gradients, AdamW's two states
    assert child_rss < 1536 << 20                           # while the model itself is 10.6 GB
