"""Round 3's format-detection attacks (issue 33, item 15): a Chrome trace is read by what its [memory] events are.

A field name elsewhere in the file (an annotation named ``Bytes``) must not decide, and a file holding
both profilers' ``[memory]`` events is refused in one line that says so, on both reader routes.
"""

from __future__ import annotations

import json
import random

import pytest

from allocsim.cli import main
from allocsim.policies import kernel
from allocsim.trace.reading import compiled
from tests.attack_files_round3_ux import DETECTED, REFUSALS, REFUSED

ROUTES = ["reference"] + (["compiled"] if compiled.ext is not None else [])


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", sorted(DETECTED))
@pytest.mark.parametrize("seed", [0, 1])
def test_a_field_name_outside_the_memory_events_does_not_decide(tmp_path, capsys, name, route, seed):
    path, expected = DETECTED[name](tmp_path, random.Random(seed))
    with kernel.route(route):
        code = main(["info", str(path), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    info = json.loads(out)
    assert {key: info[key] for key in expected} == expected


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", sorted(REFUSED))
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_memory_events_of_two_profilers_are_refused_in_one_line_that_says_so(tmp_path, capsys, name, route, seed):
    path, _ = REFUSED[name](tmp_path, random.Random(seed))
    for command in (["info", str(path)], ["run", str(path), "--policy", "pytorch", "--fast"]):
        with kernel.route(route):
            code = main(command)
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert code == 2 and out == "" and len(lines) == 1, err
        assert path.name in lines[0] and REFUSALS[name] in lines[0]
        # It counts each profiler's events and says what to do; it never says "neither" of a file that has both.
        assert "PyTorch's Kineto fields (Bytes" in lines[0] and "PaddlePaddle's (increase_bytes" in lines[0]
        assert "neither" not in lines[0] and "record each profiler to its own file" in lines[0]
