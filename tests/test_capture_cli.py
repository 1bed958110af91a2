"""``allocsim capture`` and ``advise --gpu`` refuse bad input in one line with exit 2 (no torch needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from allocsim.commands.capture import default_output
from allocsim.torch_capture.command_line import BOOTSTRAP, script_of, script_problem, split_command
from allocsim.torch_capture.session import child_command


def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "allocsim", *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.full
@pytest.mark.parametrize("argv", [["capture"], ["capture", "--", "python", "/no/such/train.py"],
                                  ["capture", "--steps", "-1", "--", "python", __file__],
                                  ["capture", "--", "python", "-Q", __file__],
                                  ["capture", "--", "python", "-c"],
                                  ["capture", "--keep-writes", "/no/such/folder/kept", "--", "python", __file__]])
def test_capture_usage_errors(argv):
    done = _cli(*argv)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("allocsim capture: error:")


def test_python_c_is_taken_and_an_interpreter_option_python_has_not_is_refused_by_name():
    from allocsim.torch_capture.session import check_script

    check_script(["python", "-c", "import torch"])
    check_script(["python", "-m", "pkg.train"])
    check_script(["python", "-u", "-X", "dev", __file__])       # the interpreter's own options pass on to it
    assert default_output(["python", "-c", "pass"]) == "command.capture.parquet"
    with pytest.raises(ValueError, match="'-Q' is not an option of the Python interpreter"):
        check_script(["python", "-Q", "train.py"])
    with pytest.raises(ValueError, match="no script 'missing.py'"):
        check_script(["python", "-u", "missing.py"])


def test_child_command_uses_the_named_interpreter_or_this_one_for_a_bare_script():
    assert child_command(["python3", "t.py", "--b", "8"]) == ["python3", BOOTSTRAP, "--", "t.py", "--b", "8"]
    assert child_command(["t.py"])[0] == sys.executable
    assert default_output(["python", "dir/train.py", "--x"]) == "train.capture.parquet"
    assert default_output(["python", "-m", "pkg.train"]) == "train.capture.parquet"
    assert default_output(["python", "-c", "import torch"]) == "command.capture.parquet"


@pytest.mark.parametrize("command, options, script", [
    (["python", "-u", "-X", "dev", "-Wignore", "t.py", "-u"], ["-u", "-X", "dev", "-Wignore"], ["t.py", "-u"]),
    (["python", "-uc", "print(1)", "a"], ["-u"], ["-c", "print(1)", "a"]),
    (["python", "-OO", "-m", "pkg.train", "--b", "8"], ["-OO"], ["-m", "pkg.train", "--b", "8"]),
    (["python", "--", "t.py"], [], ["t.py"]),
    (["python"], [], []),
])
def test_the_command_is_read_as_python_reads_it(command, options, script):
    """The interpreter's own options stay with it (they are not the script), as ``python`` itself reads them."""
    assert split_command(command) == ("python", options, script)
    assert child_command(command) == ["python", *options, BOOTSTRAP, "--", *script]


@pytest.mark.parametrize("command", [["python", "-Q", "t.py"], ["python", "--frobnicate", "t.py"],
                                     ["python", "-X"]])
def test_an_option_python_does_not_have_is_refused(command):
    with pytest.raises(ValueError):
        split_command(command)


@pytest.mark.parametrize("command, words", [
    (["python", "-c", "import sys"], None), (["python", "-m", "json.tool"], None),
    (["python", "-c"], "-c needs the code"), (["python", "-"], "standard input"),
    (["python"], "give the script"), (["python", "missing_train.py"], "no script 'missing_train.py': no such file"),
])
def test_what_cannot_run_is_named_before_anything_starts(command, words):
    problem = script_problem(script_of(command))
    assert (problem == "") if words is None else (words in problem), problem


@pytest.mark.full
def test_advise_takes_gpu_or_capacity_not_both(tmp_path):
    from allocsim.trace import write_trace
    from allocsim.trace.reading.builder import TraceBuilder

    builder = TraceBuilder("t", "test")
    builder.alloc(0, 0, 0, 0, 0x1000, 1 << 20)
    path = tmp_path / "t.parquet"
    write_trace(builder.finish(), str(path))
    done = _cli("advise", str(path), "--gpu", "T4", "--capacity", "1GiB")
    assert done.returncode == 2 and "not both" in done.stderr
    done = _cli("advise", str(path), "--gpu", "T4", "--fast", "--json")
    assert done.returncode == 0, done.stderr


def test_block_rule_of_the_kineto_comparison():
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "validate"))
    import kineto_resnet50 as k
    from collections import Counter

    assert k.could_serve(4, 512) and not k.could_serve(4, 1024)          # small: rounded to 512, slack < 512
    assert k.could_serve(51_380_224, 52_428_800)                         # large: a remainder of exactly 1 MiB
    assert not k.could_serve(51_380_224, 52_428_800 + 512)
    report = k.match(Counter({512: 2, 52_428_800: 1, 9_000_000: 1}), Counter({4: 1, 512: 1, 51_380_224: 1}))
    assert report == {"real_allocations": 4, "captured_requests": 3, "exact": 1, "served_by_rule": 2,
                      "captured_unmatched": 0, "real_left": 1, "real_left_bytes": 9_000_000}
