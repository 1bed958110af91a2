"""A captured script cannot change the user's files: ``writeguard`` redirects its writes and refuses the rest.

The guard is installed for good (its audit hook cannot be removed), so it runs here in a plain
Python subprocess (no torch: a fraction of a second) over a folder of "user" files; the script's
own view of what it did is printed as JSON and compared, and every user file must be byte-identical
after. ``test_capture_writes.py`` runs the same promise under a real capture (torch.save and friends).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from allocsim.torch_capture.scratch import ScriptWrites

REPO = Path(__file__).resolve().parents[1]

SCRIPT = r'''
import glob, io, json, logging, os, pathlib, posix, shutil, subprocess, sys, tarfile, tempfile
from allocsim.torch_capture.writeguard import WriteGuard
guard = WriteGuard(sys.argv[1]).install()
os.chdir(sys.argv[2])
seen = {}
with open("keep.txt", "w") as f:                       # written over: the script sees its own version
    f.write("clobbered")
seen["keep"] = open("keep.txt").read()
with open("log.txt", "a") as f:                        # appended to: starts from the user's bytes
    f.write("line 2\n")
seen["log"] = open("log.txt").read()
os.makedirs("out/deep", exist_ok=True)
pathlib.Path("out/deep/m.json").write_text(json.dumps({"a": 1}))
seen["listing"] = sorted(os.listdir("."))
seen["glob"] = sorted(glob.glob("out/**/*", recursive=True))
os.remove("old.txt")
seen["old_exists"] = os.path.exists("old.txt")
os.rename("ren.txt", "renamed.txt")
seen["renamed"] = open("renamed.txt").read()
shutil.rmtree("sub")
seen["sub_exists"] = os.path.isdir("sub")
shutil.copy2("renamed.txt", "out/copy.txt")
shutil.move("out/copy.txt", "out/moved.txt")
seen["moved"] = pathlib.Path("out/moved.txt").read_text()
fd = os.open("flags.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
os.write(fd, b"x")
os.close(fd)
pathlib.Path("touched").touch()
os.truncate("data.bin", 1)
seen["data"] = open("data.bin", "rb").read().decode()
os.chmod("data.bin", 0o600)
os.utime("keep.txt", (0, 0))
os.chmod("untouched.txt", 0o777)                       # a user's file: not applied
os.symlink(os.path.abspath("untouched.txt"), "link.txt")
seen["link"] = open("link.txt").read()
logging.basicConfig(filename="train.log")
logging.warning("hello")
with tarfile.open("out/a.tar", "w") as tar:
    tar.add("untouched.txt")
fd, tmp = tempfile.mkstemp()
os.close(fd)
seen["tmp_in_scratch"] = tmp.startswith(sys.argv[1])
os.replace(tmp, "from_tmp.txt")
seen["from_tmp"] = os.path.exists("from_tmp.txt")
refused = []
for attempt in (lambda: posix.open(os.path.abspath("evil"), os.O_WRONLY | os.O_CREAT),
                lambda: io.FileIO(os.path.abspath("keep.txt"), "w"),
                lambda: posix.rename(os.path.abspath("untouched.txt"), os.path.abspath("gone.txt")),
                lambda: posix.unlink(os.path.abspath("untouched.txt")),
                lambda: posix.symlink("/etc/passwd", os.path.join(sys.argv[1], "escape")),
                lambda: posix.link(os.path.abspath("untouched.txt"), os.path.join(sys.argv[1], "hard")),
                lambda: io.FileIO("/proc/self/fd/%d" % os.open("untouched.txt", os.O_RDONLY), "w")):
    try:
        attempt()
        refused.append(False)
    except PermissionError as exc:
        refused.append("allocsim capture" in str(exc))
seen["refused"] = refused
subprocess.run(["true"])
with open("/dev/null", "w") as f:
    f.write("fine")
with open("/proc/self/fd/%d" % os.open("untouched.txt", os.O_RDONLY), "w") as f:   # redirected, not reopened
    f.write("redirected")
seen["journal"] = guard.journal()
print(json.dumps(seen))
'''

USER_FILES = {"keep.txt": "precious\n", "log.txt": "line 1\n", "old.txt": "old\n", "ren.txt": "ren\n",
              "data.bin": "abc", "untouched.txt": "untouched\n", "sub/a.txt": "a\n", "sub/b/c.txt": "c\n"}


def _digest(folder: Path) -> dict[str, tuple[str, int]]:
    out = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(folder))] = (hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file()
                                              else "dir", st.st_mode)
    return out


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    base = tmp_path_factory.mktemp("guard")
    user = base / "user"
    for name, text in USER_FILES.items():
        (user / name).parent.mkdir(parents=True, exist_ok=True)
        (user / name).write_text(text)
    before = _digest(user)
    (base / "s.py").write_text(textwrap.dedent(SCRIPT))
    scratch = base / "scratch"
    scratch.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, str(base / "s.py"), str(scratch), str(user)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return before, _digest(user), json.loads(done.stdout.strip().splitlines()[-1]), scratch, user


def test_no_user_file_changes(guarded):
    before, after, _, _, _ = guarded
    assert after == before


def test_the_script_sees_what_it_did(guarded):
    _, _, seen, _, _ = guarded
    assert seen["keep"] == "clobbered" and seen["log"] == "line 1\nline 2\n"
    assert "out" in seen["listing"] and "out/deep/m.json" in seen["glob"]
    assert seen["old_exists"] is False and seen["renamed"] == "ren\n" and seen["sub_exists"] is False
    assert seen["moved"] == "ren\n" and seen["data"] == "a" and seen["link"] == "untouched\n"
    assert seen["tmp_in_scratch"] and seen["from_tmp"]


def test_what_cannot_be_redirected_is_refused(guarded):
    _, _, seen, scratch, _ = guarded
    assert seen["refused"] == [True] * 7
    assert not (scratch / "escape").exists() and not (scratch / "hard").exists()


def test_the_journal_says_what_went_where(guarded):
    _, _, seen, scratch, user = guarded
    journal = seen["journal"]
    assert journal["files"][str(user / "keep.txt")] == 1
    assert str(user / "out" / "deep" / "m.json") in journal["files"]
    assert journal["removed"] == [str(user / "old.txt"), str(user / "sub") + "/"]
    assert journal["renamed"] == [[str(user / "ren.txt"), str(user / "renamed.txt")]]
    assert journal["made"] == [str(user / "out")] and journal["skipped"] == {"chmod": 1}
    assert journal["processes"] == ["true"] and len(journal["refused"]) == 7
    # the script's versions are in the mirror
    assert (scratch / "files" / str(user / "keep.txt").lstrip("/")).read_text() == "clobbered"
    writes = ScriptWrites.read(journal, str(scratch), kept=True)
    line = writes.line(str(user))
    assert "keep.txt (1 write, 9 B)" in line and "2 removals not made: old.txt; sub/" in line
    assert "1 rename not made (copied there): ren.txt -> renamed.txt" in line
    assert f"kept in {scratch}" in line and "1 process started without the guard: true" in line


def test_a_forged_journal_is_bounded_and_checked(tmp_path):
    forged = {"files": {"a" * 10_000: -5, "b": "x", 3: 1, **{f"f{i}": 1 for i in range(1000)}},
              "removed": [1, None, "r"] * 1000, "renamed": [["a"], ["a", 2], ["x", "y"]], "skipped": "no",
              "processes": {"not": "a list"}, "copied_bytes": 10 ** 30}
    writes = ScriptWrites.read(forged, str(tmp_path), kept=False)
    assert len(writes.files) <= 200 and all(len(p) <= 500 for p in writes.files)
    assert set(writes.files.values()) <= {0, 1}
    assert writes.removed == ["r"] * 66               # the first 200 entries, the ones that are text
    assert writes.renamed == [("x", "y")] and writes.skipped == {} and writes.processes == []
    assert writes.copied_bytes == 0


def test_a_child_that_sent_nothing_is_listed_from_the_folder(tmp_path):
    (tmp_path / "files" / "home" / "u").mkdir(parents=True)
    (tmp_path / "files" / "home" / "u" / "ckpt.pt").write_bytes(b"12345")
    writes = ScriptWrites.read(None, str(tmp_path), kept=False)
    assert writes.files == {"/home/u/ckpt.pt": 0}
    assert "/home/u/ckpt.pt (5 B)" in writes.line("/elsewhere") and "sent no account" in writes.line("/elsewhere")


PYARROW_SCRIPT = r'''
import json, os, sys
from allocsim.torch_capture.writeguard import WriteGuard
guard = WriteGuard(sys.argv[1]).install()
os.chdir(sys.argv[2])
import pyarrow as pa                                   # after the guard, as a script imports it (datasets)
seen = {}
table = pa.table({"x": list(range(5))})
with open("cache.arrow", "wb") as fh:                  # Python's open: into the overlay
    writer = pa.ipc.new_stream(fh, table.schema)
    writer.write_table(table)
    writer.close()
seen["memory_map"] = pa.ipc.open_stream(pa.memory_map("cache.arrow")).read_all().num_rows
seen["input_stream"] = pa.ipc.open_stream(pa.input_stream("cache.arrow")).read_all().num_rows
with pa.OSFile("keep.txt", "wb") as f:                 # C++ writers: into the overlay too
    f.write(b"clobbered")
with pa.output_stream("new.bin") as f:
    f.write(b"new")
seen["osfile"] = pa.OSFile("keep.txt").read().decode()
seen["osfile_is_native"] = isinstance(pa.OSFile("keep.txt"), pa.NativeFile)
seen["user_keep"] = pa.memory_map("untouched.txt").read().decode()
print(json.dumps(seen))
'''


def test_pyarrow_reads_and_writes_go_through_the_overlay(tmp_path):
    """Hugging Face ``datasets`` writes its Arrow cache with Python's ``open`` (redirected to the overlay)
    and reads it back with ``pyarrow.memory_map``, which opens the path in C++: every Hugging Face
    Trainer and accelerate script of the corpus stopped with ``FileNotFoundError: Failed to open local
    file ... text-train.arrow`` (docs/corpus.md). pyarrow's path functions now see the overlay, and
    its C++ writers write there, not over the user's files."""
    pytest.importorskip("pyarrow")
    user = tmp_path / "user"
    user.mkdir()
    (user / "keep.txt").write_text("precious\n")
    (user / "untouched.txt").write_text("untouched\n")
    before = _digest(user)
    (tmp_path / "s.py").write_text(textwrap.dedent(PYARROW_SCRIPT))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = subprocess.run([sys.executable, str(tmp_path / "s.py"), str(scratch), str(user)], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"memory_map": 5, "input_stream": 5, "osfile": "clobbered", "osfile_is_native": True,
                    "user_keep": "untouched\n"}
    assert _digest(user) == before                     # no new.bin, no cache.arrow, keep.txt as it was
    assert (scratch / "files" / str(user / "new.bin").lstrip("/")).is_file()


OPENER_SCRIPT = r'''
import json, os, sys, tempfile
from allocsim.torch_capture.writeguard import WriteGuard
guard = WriteGuard(sys.argv[1]).install()
os.chdir(sys.argv[2])
with tempfile.NamedTemporaryFile("wb", dir="cache", delete=False) as tmp:   # datasets' map() cache
    tmp.write(b"abc")
name = tmp.name
with open("o.txt", "w", opener=lambda path, flags: os.open(path, flags, 0o644)) as fh:
    fh.write("hi")
print(json.dumps({"in_cache": os.path.dirname(name) == os.path.abspath("cache"), "read": open(name).read(),
                  "listing": os.listdir("cache") == [os.path.basename(name)], "o": open("o.txt").read(),
                  "o_name": fh.name}))
'''


def test_open_with_an_opener_writes_through_the_overlay(tmp_path):
    """``tempfile.NamedTemporaryFile(dir=D)`` calls ``io.open(D, "wb", opener=...)`` with the folder as the
    path and makes the file in the opener: the overlay took the folder for the file (``IsADirectoryError``,
    every Hugging Face script's ``datasets.map``). The opener now opens the file, through the overlay."""
    user = tmp_path / "user"
    (user / "cache").mkdir(parents=True)
    (user / "o.txt").write_text("precious\n")
    before = _digest(user)
    (tmp_path / "s.py").write_text(textwrap.dedent(OPENER_SCRIPT))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = subprocess.run([sys.executable, str(tmp_path / "s.py"), str(scratch), str(user)], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"in_cache": True, "read": "abc", "listing": True, "o": "hi", "o_name": "o.txt"}
    assert _digest(user) == before
