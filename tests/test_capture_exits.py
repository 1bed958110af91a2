"""Every way a captured script can end leaves a trace that is complete or says it is not (issue 40, round 4).

One capture per way of ending, all started at once by a module fixture (each test then reads its own result):
threads still running and ``atexit`` handlers doing CUDA work, a handler's ``os._exit(7)``, a segfault, a
summary forged through ``/proc/self/fd`` followed by SIGKILL, a malformed record sent with the capture's own
channel, a question flood, a request over 1 PiB, CUDA work in a subprocess and in a re-exec, a bare ``except:``
around the step under ``--steps``, a script that ignores SIGINT under ``--timeout``, a FIFO the script makes at
``-o``, a batch-size finder on a ``--gpu`` card, the user's own ``validate`` and ``pyarrow`` packages, and
``python -X dev -c CODE``. SIGTERM to ``allocsim capture`` runs the command line in a process of its own.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

if os.environ.get("CI"):
    import torch  # noqa: F401  (CI installs it: a missing torch must fail, not skip)
else:
    pytest.importorskip("torch")

from allocsim.gpus import allocator_capacity, find_gpu  # noqa: E402
from allocsim.trace import read_trace  # noqa: E402
from allocsim.trace.schema import EventKind  # noqa: E402
from allocsim.torch_capture import session  # noqa: E402

pytestmark = pytest.mark.full      # each case starts a capture child
REPO = Path(__file__).resolve().parents[1]
MiB, GiB = 1 << 20, 1 << 30

#: Writes ``data`` to every pipe descriptor the process holds, as a script that found the capture's in /proc/self/fd
#: would (the descriptors themselves: opening /proc/self/fd/N for writing goes to the write guard's scratch folder).
_TO_EVERY_PIPE = """
def to_every_pipe(data):
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:") and int(fd) > 2:
                os.write(int(fd), data)
        except OSError:
            pass
"""

SCRIPTS = {
    # non-daemon work after the main module returns, and atexit handlers, run under the capture; the last
    # handler (registered first) leaves with os._exit(7)
    "exit_paths": ("""
        import atexit, os, threading, time, torch
        keep = []
        atexit.register(lambda: os._exit(7))
        atexit.register(lambda: keep.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda")))
        def late():
            time.sleep(1.0)
            keep.append(torch.empty(16 << 30, dtype=torch.uint8, device="cuda"))
        threading.Thread(target=late).start()
        x = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
        """, {}),
    "segfault": ("""
        import ctypes, torch
        x = torch.empty(640 << 20, dtype=torch.uint8, device="cuda")
        ctypes.string_at(0)
        """, {}),
    "forged_then_killed": ("import os, signal, torch\n" + _TO_EVERY_PIPE + textwrap.dedent("""
        x = torch.empty(640 << 20, dtype=torch.uint8, device="cuda")
        to_every_pipe(b'["A",1,7,1099511627776,0,0,"f"]\\n["D",{"status":"ok","exit":0,"optimizer_steps":7}]\\n')
        os.kill(os.getpid(), signal.SIGKILL)
        """), {}),
    "malformed_in_process": ("""
        import gc, torch
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        gc.unfreeze()      # the capture froze what existed before the script: find its channel among those
        channel = next(o for o in gc.get_objects() if type(o).__name__ == "Channel")
        channel.send(["A", 1e300, 1, 1, 0, 0, "f"])
        channel.flush()
        y = torch.empty(2 << 20, dtype=torch.uint8, device="cuda")
        """, {}),
    "question_flood": ("""
        import gc, time, torch
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        gc.unfreeze()      # the capture froze what existed before the script: find its channel among those
        channel = next(o for o in gc.get_objects() if type(o).__name__ == "Channel")
        for i in range(100000):
            channel.send(["Q", i, "memory_stats"])
        channel.flush()
        time.sleep(600)
        """, {}),
    "over_a_pebibyte": ("""
        import torch
        n = 2 ** 26
        a = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
        b = torch.empty(n * n, dtype=torch.uint8, device="cuda")
        print("not reached")
        """, {}),
    "subprocess_and_reexec": ("""
        import os, subprocess, sys, torch
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        if not os.environ.get("AGAIN"):
            subprocess.run([sys.executable, "-c", "import torch; torch.empty(256 << 20, dtype=torch.uint8, device='cuda')"])
            os.environ["AGAIN"] = "1"
            os.execv(sys.executable, [sys.executable, *sys.argv])
        """, {}),
    "bare_except_steps": ("""
        import os, torch
        m = torch.nn.Linear(8, 8).cuda()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        try:
            while True:
                try:
                    m(torch.randn(4, 8, device="cuda")).sum().backward()
                    opt.step()
                except:
                    pass
        finally:
            open(os.path.join(os.path.dirname(__file__), "finally-ran"), "w").close()
        """, {"steps": 2}),
    "ignores_sigint": ("""
        import os, signal, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        import torch
        x = torch.empty(640 << 20, dtype=torch.uint8, device="cuda")
        open(os.path.join(os.path.dirname(__file__), "ignoring"), "w").close()
        while True:
            time.sleep(0.1)
        """, {"timeout_s": 25.0}),
    "fifo_at_output": ("""
        import subprocess, sys, torch
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        subprocess.run(["mkfifo", sys.argv[1]], check=True)     # a process it starts: not under the write guard
        """, {}),
    "batch_size_finder": ("""
        import os, torch
        m = torch.nn.Linear(1024, 1024).cuda()
        batch, found = 1024, []
        while True:
            try:
                y = m(torch.randn(batch, 1024, device="cuda"))
                del y
                found.append(batch)
                batch *= 2
            except torch.cuda.OutOfMemoryError as exc:
                message = str(exc)
                break
        open(os.path.join(os.path.dirname(__file__), "finder.txt"), "w").write(f"{found[-1]}\\n{message}")
        """, {"gpu": "RTX 3060"}),
    "user_packages": ("""
        import json, os, sys, torch, validate, pyarrow
        x = torch.empty(100, device="cuda")
        json.dump({"validate": validate.MARK, "pyarrow": pyarrow.MARK, "path": sys.path},
                  open(os.path.join(os.path.dirname(__file__), "seen.json"), "w"))
        """, {}),
}


def _run_one(name: str, folder: Path) -> tuple:
    source, options = SCRIPTS[name]
    work = folder / name
    work.mkdir()
    script = work / f"{name}.py"
    script.write_text(textwrap.dedent(source))
    out = work / f"{name}.parquet"
    gpu = options.get("gpu")
    kwargs = {key: options[key] for key in ("steps", "timeout_s") if key in options}
    if gpu is not None:
        model = find_gpu(gpu)
        kwargs.update(gpu=model.capture_properties(), memory_bytes=allocator_capacity(model, workspaces_in_trace=True))
    args = [str(out)] if name == "fifo_at_output" else []
    with open(work / "output.txt", "w") as log:
        result, _trace = session.capture([sys.executable, str(script), *args], str(out), stdout=log, stderr=log,
                                         keep_writes=str(work / "writes"), **kwargs)
    trace = read_trace(result.trace_path) if result.trace_path else None
    return result, trace, work


@pytest.fixture(scope="module")
def ended(tmp_path_factory):
    """Every script of ``SCRIPTS`` captured, three at a time: name -> (result, trace, its folder)."""
    folder = tmp_path_factory.mktemp("exits")
    user_site = folder / "user-site"
    for package in ("validate", "pyarrow"):          # the user's own packages of these names, first on their path
        (user_site / package).mkdir(parents=True)
        (user_site / package / "__init__.py").write_text(f"MARK = 'the user\\'s {package}'\n")
    old_path, old_grace = os.environ.get("PYTHONPATH"), session.GRACE_S
    os.environ["PYTHONPATH"] = str(user_site)
    session.GRACE_S = 3.0
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
            futures = {name: pool.submit(_run_one, name, folder) for name in SCRIPTS}
            return {name: future.result() for name, future in futures.items()}
    finally:
        session.GRACE_S = old_grace
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path


def _written(work: Path, name: str) -> Path:
    """Where the script's file ``work/name`` went: the write guard's folder, which mirrors absolute paths."""
    return work / "writes" / "files" / str(work / name).lstrip("/")


def _allocs(trace) -> list[int]:
    ev = trace.events
    return ev[ev["kind"] == int(EventKind.ALLOC)]["size_bytes"].tolist()


def _incomplete(trace) -> str:
    return next((note for note in trace.meta.notes if note.startswith("incomplete:")), "")


def test_threads_and_atexit_handlers_run_under_the_capture_and_os_exit_is_told(ended):
    result, trace, _ = ended["exit_paths"]
    assert sorted(_allocs(trace)) == [4 * MiB, 256 * MiB, 16 * GiB]
    assert result.status == session.EXIT_SCRIPT_FAILED and "os._exit(7)" in result.message
    assert "os._exit(7)" in _incomplete(trace)


def test_a_segfault_keeps_the_records_the_child_had_not_sent(ended):
    result, trace, _ = ended["segfault"]
    assert result.status == session.EXIT_SCRIPT_FAILED and "SIGSEGV" in result.message
    assert _allocs(trace) == [640 * MiB] and "SIGSEGV" in _incomplete(trace)


def test_a_summary_forged_through_proc_self_fd_is_not_believed(ended):
    result, trace, _ = ended["forged_then_killed"]
    assert result.status == session.EXIT_REFUSED and "secret" in result.message
    assert _allocs(trace) == [640 * MiB]                   # the forged 1 TiB request is not in it
    assert result.summary["optimizer_steps"] == 0 and _incomplete(trace)


def test_a_malformed_record_from_the_capture_s_own_channel_ends_it_with_its_reason(ended):
    result, trace, work = ended["malformed_in_process"]
    assert result.status == session.EXIT_REFUSED and "float, not an integer" in result.message
    assert _allocs(trace) == [MiB] and "Traceback" not in (work / "output.txt").read_text()


def test_questions_never_read_end_the_capture_instead_of_a_deadlock(ended):
    result, trace, _ = ended["question_flood"]
    assert result.status == session.EXIT_REFUSED and "without reading the answers" in result.message
    assert result.seconds < 120 and _allocs(trace) == [MiB]


def test_a_request_over_a_pebibyte_ends_the_capture_with_its_reason(ended):
    result, trace, work = ended["over_a_pebibyte"]
    assert result.status == session.EXIT_REFUSED
    assert "4,503,599,627,370,496 bytes" in result.message and "over_a_pebibyte.py:5" in result.message
    assert _allocs(trace) == [4 * MiB] and "not reached" not in (work / "output.txt").read_text()


def test_cuda_work_in_a_subprocess_or_a_re_exec_is_named_not_lost(ended):
    result, trace, work = ended["subprocess_and_reexec"]
    assert result.status == session.EXIT_SCRIPT_FAILED
    assert "os.execv" in result.message and "ran CUDA work" in result.message
    assert _allocs(trace) == [MiB]                         # what the first process did, kept through the exec
    output = (work / "output.txt").read_text()
    assert "runs without the capture" in output and "Torch not compiled with CUDA enabled" not in output


def test_steps_end_the_script_even_through_a_bare_except(ended):
    result, trace, work = ended["bare_except_steps"]
    assert result.status == session.EXIT_OK and result.summary["optimizer_steps"] == 2
    assert "ProfilerStep#2" in trace.labels and "ProfilerStep#3" not in trace.labels
    assert not _written(work, "finally-ran").exists() and not (work / "finally-ran").exists()             # the process ends at the step: nothing can catch it


def test_a_script_that_ignores_sigint_is_killed_after_the_timeout_with_its_records(ended):
    result, trace, work = ended["ignores_sigint"]
    assert _written(work, "ignoring").exists()
    assert result.status == session.EXIT_TIMEOUT and "was killed" in result.message
    assert _allocs(trace) == [640 * MiB]


def test_a_fifo_made_at_the_output_path_neither_hangs_nor_is_replaced(ended):
    result, _trace, work = ended["fifo_at_output"]
    fifo = work / "fifo_at_output.parquet"
    assert result.status == session.EXIT_OK and fifo.is_fifo()
    assert result.trace_path == str(work / "fifo_at_output.1.parquet") and "FIFO" in result.moved
    assert _allocs(read_trace(result.trace_path)) == [MiB]


def test_a_batch_size_finder_stops_where_the_card_runs_out(ended):
    result, trace, work = ended["batch_size_finder"]
    largest, message = _written(work, "finder.txt").read_text().split("\n", 1)
    # RTX 3060: 11.76 GiB, 11.53 GiB of it for tensors (allocsim gpus). A batch of B float32 rows of 1024 takes
    # 4 KiB x B for the input and again for the output: 2^20 rows take 8 GiB and fit; at 2^21 the 8 GiB input
    # fits (the cached 4 GiB segments released first, as PyTorch's retry does) and the 8 GiB output does not.
    assert int(largest) == 1 << 20 and result.status == session.EXIT_OK
    assert message.startswith("CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of "
                              "11.76 GiB of which ")
    assert result.summary["out_of_memory_errors"] == 1
    assert any(label.startswith("out of memory: a request of 8,589,934,592 bytes") for label in trace.labels)


def test_the_script_sees_the_user_s_packages_not_allocsim_s(ended):
    import json

    result, _trace, work = ended["user_packages"]
    assert result.status == session.EXIT_OK
    seen = json.loads(_written(work, "seen.json").read_text())
    assert seen["validate"] == "the user's validate" and seen["pyarrow"] == "the user's pyarrow"
    assert str(REPO) not in seen["path"] and str(REPO / "allocsim" / "torch_capture") not in seen["path"]


def test_python_options_and_c_code_run_as_python_runs_them(tmp_path):
    code = "import sys, torch; x = torch.empty(1000, device='cuda'); open('flags', 'w').write(repr(sys.flags.dev_mode))"
    os.chdir(tmp_path)
    result, trace = session.capture([sys.executable, "-X", "dev", "-c", code], str(tmp_path / "c.parquet"),
                                    keep_writes=str(tmp_path / "writes"))
    assert result.status == session.EXIT_OK and _allocs(trace) == [4000]
    assert _written(tmp_path, "flags").read_text() == "True" and trace.meta.source == "python -c"


def test_sigterm_to_allocsim_ends_the_script_and_writes_the_partial_trace(tmp_path):
    script = tmp_path / "waits.py"
    script.write_text(textwrap.dedent("""
        import os, time, torch
        x = torch.empty(640 << 20, dtype=torch.uint8, device="cuda")
        open("pid", "w").write(str(os.getpid()))
        while True:
            time.sleep(0.1)
        """))
    out = tmp_path / "waits.parquet"
    proc = subprocess.Popen([sys.executable, "-m", "allocsim", "capture", "-o", str(out), "--keep-writes",
                             str(tmp_path / "writes"), "--", sys.executable, str(script)], cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    pid_file = _written(tmp_path, "pid")
    deadline = time.monotonic() + 120
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    child_pid = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    _stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == session.EXIT_TERMINATED, stderr
    assert "SIGTERM" in stderr and "Traceback" not in stderr
    assert _allocs(read_trace(str(out))) == [640 * MiB]
    with pytest.raises(ProcessLookupError):
        os.kill(child_pid, 0)
