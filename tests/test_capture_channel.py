"""The capture's private pipe: frames with the capture's secret and sequence numbers, bounded and linear, nothing
lost when the child dies, and every record checked before the parent uses it (no torch needed: the two ends
and the parent's converter run in this process)."""

from __future__ import annotations

import json
import mmap
import os
import tempfile
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocsim.torch_capture import channel as ch
from allocsim.torch_capture.oom import format_size, oom_message
from allocsim.torch_capture.records import MAX_REQUEST_BYTES, Refused, checked
from allocsim.torch_capture.session import (EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED, EXIT_SCRIPT_FAILED,
                                            _AllocatorModel, _Converter, _ending)

SECRET = b"0123456789abcdef0123456789abcdef"


@pytest.fixture
def wire():
    """A child's Channel writing into a pipe, the tail mapping, and the parent's reader and tail view."""
    events_r, events_w = os.pipe()
    answers_r, answers_w = os.pipe()
    tail_file = tempfile.TemporaryFile()
    tail_file.truncate(ch.TAIL_BYTES)
    tail = mmap.mmap(tail_file.fileno(), ch.TAIL_BYTES, access=mmap.ACCESS_READ)
    channel = ch.Channel(events_w, answers_r, os.dup(tail_file.fileno()), SECRET)
    received = bytearray()

    def read_all() -> None:          # the parent's side: the child's writes never wait for it
        while True:
            chunk = os.read(events_r, 1 << 20)
            if not chunk:
                return
            received.extend(chunk)

    reader_thread = threading.Thread(target=read_all, daemon=True)
    reader_thread.start()

    def drained() -> bytes:
        time.sleep(0.2)
        data = bytes(received)
        received.clear()
        return data

    yield channel, ch.FrameReader(SECRET), tail, drained, answers_w
    os.close(events_w)
    reader_thread.join(5)
    for fd in (events_r, answers_r, answers_w):
        os.close(fd)
    tail_file.close()


def test_frames_carry_the_lines_in_order(wire):
    channel, reader, _tail, drained, _ = wire
    lines = [b'["M",%d,"step"]' % i for i in range(20000)]    # several frames of 64 KiB
    for line in lines:
        channel.send_line(line + b"\n")
    channel.flush()
    assert reader.feed(drained()) == lines and not reader.damaged and reader.seq > 5


@pytest.mark.parametrize("forged, why", [
    (b'["D",{"status":"ok","exit":0,"optimizer_steps":7}]\n', "secret"),          # a summary written by the script
    (b"x" * 200, "secret"),                                                       # bytes without a newline
    (SECRET + b" %016x %08x\n" % (5, 10) + b"[1]\n" * 3, "frame 5 where frame 1"),  # the secret, a wrong number
    (SECRET + b" %016x %08x\n" % (1, ch.MAX_FRAME_BYTES + 1), "announces"),        # too long a frame
])
def test_bytes_the_capture_did_not_write_are_found_at_the_first_frame_they_touch(wire, forged, why):
    channel, reader, _tail, drained, _ = wire
    channel.send(["M", 1, "ProfilerStep#0"])
    channel.flush()
    os.write(channel._write_fd, forged)
    channel.send(["M", 2, "ProfilerStep#1"])
    channel.flush()
    lines = reader.feed(drained())
    assert lines == [b'["M",1,"ProfilerStep#0"]'] and why in reader.damaged
    assert reader.feed(b"more") == []


def test_bytes_without_a_newline_are_read_in_linear_time_and_bounded_memory():
    """256 MiB with no newline in 1 MiB chunks (the round-4 attack took > 300 s): refused at once, nothing kept."""
    reader = ch.FrameReader(SECRET)
    block = b"x" * (1 << 20)
    start = time.process_time()
    for _ in range(256):
        reader.feed(block)
        assert len(reader._buffer) == 0
    assert reader.damaged and time.process_time() - start < 2.0
    # a frame announced at the largest size waits for its bytes, holding no more than it announced
    reader = ch.FrameReader(SECRET)
    reader.feed(SECRET + b" %016x %08x\n" % (0, ch.MAX_FRAME_BYTES))
    for _ in range(ch.MAX_FRAME_BYTES // len(block) - 1):
        assert reader.feed(block) == []
    assert len(reader._buffer) <= ch.MAX_FRAME_BYTES and not reader.damaged


def test_lines_the_child_never_wrote_are_read_from_the_tail(wire):
    channel, reader, tail, drained, _ = wire
    channel.send(["M", 1, "sent"])
    channel.flush()
    channel.send(["A", 2, 512, 4, 0, 0, "f"])                 # gathered, never written: the child dies here
    assert reader.feed(drained()) == [b'["M",1,"sent"]']
    assert reader.tail(tail) == ([b'["A",2,512,4,0,0,"f"]'], "")


def test_a_frame_written_just_before_the_child_died_is_not_read_twice(wire):
    channel, reader, tail, drained, _ = wire
    channel.send(["A", 2, 512, 4, 0, 0, "f"])
    frame = b"%s %016x %08x\n" % (SECRET, 0, channel._fill) + bytes(tail[16:16 + channel._fill])
    os.write(channel._write_fd, frame)                         # written whole, then killed before the reset
    assert reader.feed(drained()) == [b'["A",2,512,4,0,0,"f"]']
    assert reader.tail(tail) == ([], "")


def test_a_frame_cut_short_by_a_kill_comes_back_whole_from_the_tail(wire):
    channel, reader, tail, drained, _ = wire
    channel.send(["M", 1, "a"])
    channel.send(["M", 2, "b"])
    frame = b"%s %016x %08x\n" % (SECRET, 0, channel._fill) + bytes(tail[16:16 + channel._fill])
    os.write(channel._write_fd, frame[:40])                    # killed in the middle of writing the frame
    assert reader.feed(drained()) == [] and reader.mid_frame
    assert reader.tail(tail)[0] == [b'["M",1,"a"]', b'["M",2,"b"]']


def test_an_answer_is_matched_to_its_question(wire):
    channel, reader, _tail, drained, answers_w = wire
    os.write(answers_w, b'[7,"stale"]\nnot json\n[0,{"allocated_bytes.all.current":512}]\n')
    assert channel.ask("memory_stats") == {"allocated_bytes.all.current": 512}
    assert reader.feed(drained()) == [b'["Q",0,"memory_stats"]']


def test_a_forked_process_writes_nothing(wire):
    channel, _reader, _tail, drained, _ = wire
    channel._forked()
    channel.send(["M", 1, "from a DataLoader worker"])
    channel.flush()
    assert drained() == b""


# ---------------------------------------------------------------------------------- records
@pytest.mark.parametrize("line, words", [
    (b'["A",1e400,1,1,0,0,"f"]', "float"), (b'["A","x",1,1,0,0,"f"]', "str"), (b'["A",true,1,1,0,0,"f"]', "bool"),
    (b'["A",1,2,%d,0,0,"f"]' % (1 << 70), "outside"), (b'["A",1,2,0,0,0,"f"]', "outside"),
    (b'["A",1,2,3,0,0]', "fields"), (b'["A",1,2,3,0,0,"z"]', "phase"), (b'["S",0,null]', "frames"),
    (b'["S",0,[["f",1]]]', "frame must be"), (b'["D",1]', "object"), (b'[' * 200000, "JSON"),
    (b'\xff', "JSON"), (b'{}', "array"), (b'["W"]', "unknown"), (b'["N","%s"]' % (b"x" * 5000), "characters"),
    (b'["Q",-1,"memory_stats"]', "outside"), (b'["D",{"x":"%s"}]' % (b"y" * (5 << 20)), "bytes"),
])
def test_a_malformed_record_is_refused_with_its_rule(line, words):
    with pytest.raises(Refused, match=words):
        checked(line)


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda children: st.lists(children, max_size=8) | st.dictionaries(st.text(max_size=5), children,
                                                                                          max_size=4), max_leaves=30),
       st.sampled_from(["A", "R", "F", "S", "C", "M", "E", "N", "X", "Q", "H", "D"]))
def test_no_record_crashes_the_parent(fields, kind):
    """Whatever the script writes with the capture's own channel, the parent refuses it or takes it: no other error."""
    converter = _Converter("t.parquet")
    message = [kind, *fields] if isinstance(fields, list) else [kind, fields]
    converter.feed(json.dumps(message).encode())
    converter.feed(b'["F",5,4096,0]')
    trace = converter.finish(EXIT_REFUSED if converter.refused else EXIT_OK, converter.refused, 0.0)
    assert trace is not None


def test_a_record_the_capture_cannot_take_ends_it_and_nothing_after_counts():
    converter = _Converter("t.parquet")
    converter.feed(b'["A",1,512,1048576,0,-1,"f"]')
    converter.feed(b'["A",2,2097152,%d,0,-1,"f"]' % (MAX_REQUEST_BYTES + 1))
    converter.feed(b'["A",3,4194304,512,0,-1,"f"]')
    assert "1 PiB" in converter.refused and converter.n_allocs == 1
    trace = converter.finish(EXIT_REFUSED, converter.refused, 0.0)
    assert trace.events["size_bytes"].tolist() == [1048576]
    assert any(note.startswith("incomplete:") and "1 PiB" in note for note in trace.meta.notes)


@pytest.mark.parametrize("lines, words", [
    ([b'["F",1,512,0]'], "not allocated"),                                       # a free of nothing
    ([b'["S",0,[]]', b'["S",0,[]]'], "defined twice"),
    ([b'["A",5,512,64,0,-1,"f"]', b'["A",4,1024,64,0,-1,"f"]'], "time goes back"),
    ([b'["A",5,512,64,0,-1,"f"]', b'["A",6,512,64,0,-1,"f"]'], "still allocated"),
    ([b'["A",5,512,64,0,-1,"f"]', b'["C",512,"mystery"]'], "unknown category"),
])
def test_records_that_break_the_traces_rules_end_the_capture(lines, words):
    converter = _Converter("t.parquet")
    for line in lines:
        converter.feed(line)
    assert words in converter.refused


def test_steps_are_counted_from_the_markers_received_not_from_the_summary():
    converter = _Converter("t.parquet")
    for line in (b'["M",1,"ProfilerStep#0"]', b'["M",2,"ProfilerStep#1"]', b'["M",3,"memory snapshot ProfilerStep#9"]',
                 b'["D",{"status":"ok","exit":0,"optimizer_steps":7}]'):
        converter.feed(line)
    assert converter.steps == 1 and converter.summary["optimizer_steps"] == 7


# ---------------------------------------------------------------------------------- how the capture ended
def _converter_with(summary: dict | None) -> _Converter:
    converter = _Converter("t.parquet")
    if summary is not None:
        converter.feed(json.dumps(["D", summary]).encode())
    return converter


@pytest.mark.parametrize("code, summary, status, words", [
    (0, {"status": "ok", "exit": 0}, EXIT_OK, ""),
    (-9, {"status": "ok", "exit": 0}, EXIT_SCRIPT_FAILED, "killed by SIGKILL"),       # a forged summary, then SIGKILL
    (-11, None, EXIT_SCRIPT_FAILED, "killed by SIGSEGV"),
    (0, None, EXIT_SCRIPT_FAILED, "before the capture finished"),                    # an exec'd program ended well
    (7, {"status": "ok", "exit": 0}, EXIT_SCRIPT_FAILED, "exit status 7 after the capture's summary"),
    (0, {"status": "ok", "exit": 3}, EXIT_SCRIPT_FAILED, "claims exit status 3"),
    (3, {"status": "the script raised ValueError: x", "exit": 3}, EXIT_SCRIPT_FAILED, "raised ValueError"),
    (4, {"status": "a request of 9 bytes", "exit": 4}, EXIT_REFUSED, "a request"),
    (130, {"status": "the script was interrupted (SIGINT)", "exit": 130}, EXIT_INTERRUPTED, "interrupted"),
])
def test_how_the_script_ended_is_the_parents_own_observation(code, summary, status, words):
    assert _ending(code, _converter_with(summary), None)[0] == status
    assert words in _ending(code, _converter_with(summary), None)[1]


# ---------------------------------------------------------------------------------- the card's memory
def test_a_request_the_modelled_card_cannot_serve_is_answered_as_pytorch_answers_it():
    capacity = 1 << 30
    converter = _Converter("t.parquet", _AllocatorModel(capacity, capacity + (512 << 20)))
    ok = converter.feed(b'["R",0,1,512,%d,0,-1,"f"]' % (600 << 20))
    assert ok[0] == 0 and ok[1] == {"ok": capacity - (600 << 20)}
    oom = converter.feed(b'["R",1,2,%d,%d,0,-1,"f"]' % (1 << 40, 600 << 20))
    assert oom[0] == 1 and oom[1]["oom"].startswith("CUDA out of memory. Tried to allocate 600.00 MiB. GPU 0 has a "
                                                    "total capacity of 1.50 GiB of which 424.00 MiB is free.")
    assert converter.feed(b'["F",3,%d,0]' % (1 << 40)) is None and not converter.refused   # nothing to free
    trace = converter.finish(EXIT_OK, "", 0.0)
    assert trace.events["size_bytes"].max() == 600 << 20 and converter.n_allocs == 1
    assert trace.labels == ["out of memory: a request of 629,145,600 bytes"]


@pytest.mark.parametrize("size, text", [(1024, "1024 bytes"), (1025, "1.00 KiB"), (1 << 20, "1024.00 KiB"),
                                        ((1 << 20) + 1, "1.00 MiB"), (1 << 30, "1024.00 MiB"),
                                        (85018279936, "79.18 GiB")])
def test_sizes_are_written_as_c10_format_size_writes_them(size, text):
    assert format_size(size) == text


def test_the_message_names_the_segment_pytorch_would_have_tried():
    # a 1 MiB + 1 request takes a 20 MiB segment (kLargeBuffer), a 10 MiB one is rounded to 2 MiB
    assert "Tried to allocate 20.00 MiB." in oom_message((1 << 20) + 1, 1 << 33, 0, 0, 0)
    assert "Tried to allocate 12.00 MiB." in oom_message((10 << 20) + 1, 1 << 33, 0, 0, 0)
    assert "and 2.00 MiB is reserved by PyTorch but unallocated" in oom_message(512, 1 << 33, 0, 1 << 20, 3 << 20)


# ---------------------------------------------------------------------------------- around the child
def test_reports_of_cuda_work_outside_are_read_without_following_links_or_opening_fifos(tmp_path):
    from allocsim.torch_capture.session import _outside_reports

    (tmp_path / "cuda-123.txt").write_text("python other.py --train")
    os.mkfifo(tmp_path / "cuda-5.txt")
    (tmp_path / "cuda-6.txt").symlink_to("/etc/hostname")
    (tmp_path / "notes.txt").write_text("not a report")
    assert _outside_reports(str(tmp_path)) == ["pid 123: python other.py --train", "pid 5: ", "pid 6: ?"]
    assert _outside_reports(str(tmp_path / "missing")) == []


def _small_trace():
    from allocsim.trace.reading.builder import TraceBuilder

    builder = TraceBuilder("t", "test")
    builder.alloc(0, 0, 0, 0, 0x1000, 1 << 20)
    return builder.finish()


@pytest.mark.parametrize("make, why", [
    (lambda p: os.mkfifo(p), "a FIFO"),
    (lambda p: p.write_text("my notes\n"), "a file allocsim did not write"),
    (lambda p: p.symlink_to(p.parent / "elsewhere.parquet"), "a symbolic link"),
    (lambda p: p.mkdir(), "a folder"),
])
def test_the_trace_never_replaces_what_the_script_made_at_the_output_path(tmp_path, make, why):
    from allocsim.torch_capture.trace_file import write_capture

    out = tmp_path / "t.parquet"
    make(out)
    written, moved = write_capture(_small_trace(), str(out))
    assert written == str(tmp_path / "t.1.parquet") and why in moved
    assert not (tmp_path / "elsewhere.parquet").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []     # no temporary left


def test_the_trace_replaces_an_allocsim_trace_atomically(tmp_path):
    from allocsim.torch_capture.trace_file import write_capture
    from allocsim.trace import read_trace

    out = tmp_path / "t.csv"
    for _ in range(2):
        assert write_capture(_small_trace(), str(out)) == (str(out), "")
    assert read_trace(str(out)).events["size_bytes"].tolist() == [1 << 20]
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]


def test_the_descendants_sitecustomize_hands_over_to_the_users_own(tmp_path):
    """A process the script starts runs the user's sitecustomize too (the capture's is first on its path)."""
    import subprocess
    import sys

    from allocsim.torch_capture.session import HOOKS_DIR

    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import builtins; builtins.USER_SITE_RAN = True\n")
    done = subprocess.run([sys.executable, "-c", "import builtins, sitecustomize; "
                           "print(getattr(builtins, 'USER_SITE_RAN', False), sitecustomize.__file__)"],
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([HOOKS_DIR, str(user)]),
                                   ALLOCSIM_CAPTURE_OUTSIDE=str(tmp_path)),
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", str(user / "sitecustomize.py")], done.stderr
