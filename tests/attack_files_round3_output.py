"""Hostile trace files of round 3 (output, terminal safety, bounded work), one generator per class.

Beside ``attack_files.py``'s: each generator writes a file into a folder and returns its path; the
sizes are parameters so that the fast suite runs a small case and ``-m slow`` the one the attack
was found with. ``tests/test_attack_round3_output.py`` runs them.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

MiB = 1 << 20

#: Control and bidi characters a trace may hold in its text (see ``allocsim.terminal``): the ones that
#: set a terminal's title, erase a line, move the cursor back or reorder what is shown.
HOSTILE_TEXT = ("\x1b]0;pwned\x07\x1b[2K\rFITS in 80.00 GiB\x1b[1A\x7f\x9b31m"
                "\u202eevil\u202c\u2066x\u2069\u200e\u200f\u061c\u2028\ufeff")


def _snapshot(path: Path, entries: list[dict], segments: list | None = None) -> Path:
    path.write_bytes(pickle.dumps({"segments": segments or [], "device_traces": [entries]}, protocol=4))
    return path


def _alloc(i: int, frames: list[dict], size: int = MiB, t: int | None = None) -> dict:
    return {"action": "alloc", "addr": (1 << 30) + i * 2 * MiB, "size": size, "stream": 0,
            "time_us": i if t is None else t, "frames": frames}


def _frees(i: int, t: int) -> list[dict]:
    frames = [{"filename": "train.py", "line": 2, "name": "main"}]
    return [{"action": act, "addr": (1 << 30) + i * 2 * MiB, "size": MiB, "stream": 0, "time_us": t,
             "frames": frames} for act in ("free_requested", "free_completed")]


# ------------------------------------------------------------------------------- bounded work
def distinct_stacks_snapshot(folder: Path, n: int) -> Path:
    """``n`` allocations, each with its own stack (a file and function of its own), all freed at the
    end: ``report`` converted the frame columns once per new stack (quadratic)."""
    entries = [_alloc(i, [{"filename": f"model_{i}.py", "line": i, "name": f"fn_{i}"},
                          {"filename": "train.py", "line": 1, "name": "main"}], t=2 * i) for i in range(n)]
    for i in range(n):
        entries += _frees(i, 2 * n + i)
    return _snapshot(folder / f"stacks_{n}.pickle", entries)


def long_frames_snapshot(folder: Path, n_frames: int, n_entries: int) -> Path:
    """``n_frames`` frames sharing one 65,000-character file name and function name (the pickle's
    memo stores each once), two per stack over ``n_entries`` allocations: 4,500 and 65,000 make a
    3.4 MB file whose distinct frames hold 585 million characters, under the reader's caps."""
    filename, name = "x" * 65_000 + ".py", "y" * 65_000
    frames = [{"filename": filename, "line": i, "name": name} for i in range(n_frames)]
    entries = [_alloc(i, [frames[i % n_frames], frames[(7 * i) % n_frames]]) for i in range(n_entries)]
    return _snapshot(folder / "long_frames.pickle", entries)


def page_bomb_snapshot(folder: Path, n_frames: int, n_allocs: int) -> Path:
    """Live allocations whose 40-frame stacks draw on ``n_frames`` frames of 32,000-character names:
    each report page listed every stack's frames in full (300 and 2,000: 41 MiB from 400 kB)."""
    filename, name = "m/" * 16_000 + "model.py", "forward_" * 4_000
    frames = [{"filename": filename, "line": i, "name": name} for i in range(n_frames)]
    entries = [_alloc(i, [frames[(i * 7 + k * 13) % n_frames] for k in range(40)]) for i in range(n_allocs)]
    return _snapshot(folder / "page_bomb.pickle", entries)


def many_ooms_snapshot(folder: Path, n: int) -> Path:
    """``n`` recorded OOM entries before one request: ``info`` cut the list once per OOM (quadratic)."""
    frames = [{"filename": "train.py", "line": 1, "name": "step"}]
    entries = [{"action": "oom", "addr": 0, "size": 1 << 30, "stream": 0, "time_us": i, "device_free": MiB,
                "frames": frames} for i in range(n)]
    return _snapshot(folder / f"ooms_{n}.pickle", entries)


def empty_sets_pickle(folder: Path, n: int) -> Path:
    """``n`` one-byte EMPTY_SET opcodes where the segments go: 9.5 million of them (a 9.5 MB file)
    made 2.3 GB of sets before the reader said a segment is not a dict."""
    path = folder / "sets.pickle"
    path.write_bytes(b"\x80\x04}(\x8c\x08segments](" + b"\x8f" * n + b"e\x8c\x0ddevice_traces]u.")
    return path


#: Sparse files: (name, first bytes); ``sparse_file`` extends each with a hole of zeros.
SPARSE_HEADS = {
    "kineto.json": b'{"traceEvents": [',
    "rmm.csv": b"Action,Pointer,Size\n",
    "snapshot.pickle": b"\x80\x04\x95",
    "native.csv": b"# allocsim {}\n",
    "events.csv": b"t_ns,kind,alloc_id,size_bytes,stream,device\n",
    "zeros.json": b"",
}


def sparse_file(folder: Path, name: str, size_bytes: int, head: bytes | None = None) -> Path:
    """``head`` (by default ``SPARSE_HEADS[name]``), then zeros up to ``size_bytes`` (a hole: no disk
    used), as ``truncate -s 4G f.json`` leaves a file: each was read to the memory limit."""
    path = folder / name
    path.write_bytes(SPARSE_HEADS[name] if head is None else head)
    os_truncate(path, size_bytes)
    return path


def os_truncate(path: Path, size_bytes: int) -> None:
    """Extend ``path`` to ``size_bytes`` with a hole."""
    with open(path, "r+b") as fh:
        fh.truncate(size_bytes)


# ------------------------------------------------------------------------------- terminal text
def hostile_text_snapshot(folder: Path, text: str = HOSTILE_TEXT) -> Path:
    """A snapshot whose frame file and function names carry control and bidi characters."""
    frames = [{"filename": f"train{text}.py", "line": 3, "name": f"step{text}"}]
    entries = [_alloc(0, frames), *_frees(0, 5)]
    return _snapshot(folder / "hostile_text.pickle", entries)


def hostile_text_kineto(folder: Path, text: str = HOSTILE_TEXT) -> Path:
    """A Kineto trace whose enclosing op and step names carry control and bidi characters."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
              {"ph": "X", "cat": "cpu_op", "name": f"aten::mm{text}", "ts": 1, "dur": 10, "pid": 1, "tid": 1},
              {"ph": "i", "name": "[memory]", "ts": 2, "pid": 1, "tid": 1,
               "args": {"Addr": 4096, "Bytes": 512, "Device Type": 1, "Device Id": 0}},
              {"ph": "i", "name": "[memory]", "ts": 3, "pid": 1, "tid": 1,
               "args": {"Addr": 4096, "Bytes": -512, "Device Type": 1, "Device Id": 0}}]
    path = folder / "hostile_text.json"
    path.write_text(json.dumps({"traceEvents": events, "deviceProperties": [
        {"id": 0, "name": f"GPU{text}", "totalGlobalMem": 80 << 30}]}))
    return path


# ------------------------------------------------------------------------------- lone surrogates
#: A lone high surrogate, as ``\ud800`` in JSON or a surrogate-pass UTF-8 string in a pickle.
SURROGATE = "\ud800"


def surrogate_snapshot(folder: Path) -> Path:
    """A snapshot whose frame name and file name hold lone surrogates (pickle writes them as is)."""
    frames = [{"filename": "train\udcff.py", "line": 3, "name": f"op{SURROGATE}name"}]
    return _snapshot(folder / "surrogate.pickle", [_alloc(0, frames), *_frees(0, 5)])


def surrogate_kineto(folder: Path) -> Path:
    """A Kineto trace whose op name is ``op\\ud800name`` (a JSON escape of a lone surrogate)."""
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{SURROGATE}name", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
              {"ph": "i", "name": "[memory]", "ts": 1, "pid": 1, "tid": 1,
               "args": {"Addr": 4096, "Bytes": 512, "Device Type": 1, "Device Id": 0}},
              {"ph": "i", "name": "[memory]", "ts": 2, "pid": 1, "tid": 1,
               "args": {"Addr": 4096, "Bytes": -512, "Device Type": 1, "Device Id": 0}}]
    path = folder / "surrogate.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def surrogate_paddle(folder: Path) -> Path:
    """A Paddle trace whose operator is ``op\\ud800name dygraph``."""
    def mem(cat: str, t: int, inc: int) -> dict:
        return {"name": "[memory]", "pid": 7, "tid": "7(C++)", "ts": t, "ph": "i", "cat": cat,
                "args": {"place": "Place(gpu:0)", "addr": "4096", "increase_bytes": inc,
                         "current_allocated": max(inc, 0), "current_reserved": 0, "peak_allocated": 0,
                         "peak_reserved": 0}}
    events = [{"ph": "X", "name": f"op{SURROGATE}name dygraph", "ts": 0, "dur": 10, "pid": 7, "tid": "7(C++)",
               "cat": "Operator"}, mem("Allocate", 1, 512), mem("Free", 2, -512)]
    path = folder / "surrogate_paddle.json"
    path.write_text(json.dumps({"schemaVersion": "1.0.2", "span_index": "0", "traceEvents": events,
                                "ExtraInfo": {}}))
    return path


def surrogate_rmm(folder: Path) -> Path:
    """An RMM log with the UTF-8 bytes of a surrogate (``ED A0 80``) in a field."""
    path = folder / "surrogate.csv"
    path.write_bytes(b"Thread,Time,Action,Pointer,Size,Stream\n"
                     b"1\xed\xa0\x80,10:00:00.000001,allocate,0x1000,512,0x0\n"
                     b"1,10:00:00.000002,free,0x1000,512,0x0\n")
    return path


def surrogate_native(folder: Path, suffix: str) -> Path:
    """allocsim CSV (``.csv``) or Parquet (``.parquet``) whose header JSON holds ``\\ud800`` escapes
    in a step label, a note and (CSV, whose side tables are in its header) an op name."""
    import pyarrow.parquet as pq

    from allocsim.trace import read_trace, write_trace

    trace = read_trace(hostile_text_kineto(folder, text="MARK"))
    trace.meta.notes.append("note MARK")
    path = folder / f"surrogate_native{suffix}"
    write_trace(trace, path)
    if suffix == ".csv":
        header, _, rest = path.read_text(encoding="utf-8").partition("\n")
        path.write_text(header.replace("MARK", "\\ud800").replace("ProfilerStep#1", "ProfilerStep#1\\ud800")
                        + "\n" + rest, encoding="utf-8")
        return path
    table = pq.read_table(path)
    meta = dict(table.schema.metadata)
    meta[b"allocsim"] = (meta[b"allocsim"].replace(b"MARK", b"\\ud800")
                         .replace(b"ProfilerStep#1", b"ProfilerStep#1\\ud800"))
    pq.write_table(table.replace_schema_metadata(meta), path)
    return path


# ------------------------------------------------------------------------------- output targets
def scale_inputs(folder: Path) -> tuple[Path, Path]:
    """Two snapshots of one program at batch 1 and 2 (four allocations a step growing with the batch)."""
    paths = []
    for batch in (1, 2):
        entries, t = [], 0
        for _step in range(3):
            for i in range(4):
                frames = [{"filename": "train.py", "line": 10 + i, "name": "forward"}]
                entries.append({"action": "alloc", "addr": (1 << 30) + i * 64 * MiB, "size": (i + 1) * MiB * batch,
                                "stream": 0, "time_us": t, "frames": frames})
                t += 1
            for i in range(4):
                for act in ("free_requested", "free_completed"):
                    entries.append({"action": act, "addr": (1 << 30) + i * 64 * MiB, "size": (i + 1) * MiB * batch,
                                    "stream": 0, "time_us": t, "frames": []})
                t += 1
        paths.append(_snapshot(folder / f"b{batch}.pickle", entries))
    return paths[0], paths[1]
