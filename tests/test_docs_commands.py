"""Every command the README and docs/ show in a ``bash`` block runs, here or in the test named for it.

A block is run top to bottom in a fresh folder (so ``sweep ... -o results.parquet`` then ``winners
results.parquet`` works), with ``traces/`` and ``../shared/`` paths taken from the repository. Lines
``# TEXT`` right under a command are its output: each must be a line it prints (``TEXT ...``: a line
that starts with TEXT). Commands that another test already runs with its output checked, or that need
a GPU, a user's script or minutes, are listed in COVERED with that test; every ``python`` block runs too.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from .conftest import ROOT, SHARED_DIR, doc_pages

#: Commands run elsewhere: command as the docs write it -> (the test or fixture that runs it, why not here).
COVERED: dict[str, tuple[str, str]] = {
    **{command: (
        "tests/test_validate_corpus.py::test_a_script_of_a_pinned_tree_is_captured_and_matches_its_arithmetic",
        "needs clones of eight public repositories and a venv of their libraries, and an hour; the test runs a "
        "pinned tree's script through the same path")
       for command in ("python -m validate corpus --repos repos --extract-from clones --python corpus-venv/bin/python "
                       "--work corpus-work",
                       "python -m validate corpus --repos repos --python corpus-venv/bin/python --work corpus-work "
                       "--jobs 1 --fresh --json")},
    "python -m pytest -q": (
        "tests/test_docs_commands.py::test_ci_runs_the_readme_test_command", "the suite itself: .ci/run runs it"),
    "python -m pytest -q -m full": (
        "tests/test_docs_commands.py::test_ci_runs_the_readme_test_command", "the full suite: .ci/run runs it"),
    **{f"allocsim run $S --policy pytorch{extra}": (
        "tests/test_verdict.py::test_the_readme_oom_story_is_what_run_prints",
        "checks each verdict line under it, with --fast (the four timed replays of a 9k-event snapshot take long)")
       for extra in ("", " --capacity 20GiB", " --capacity 20GiB --alloc-conf expandable_segments:True",
                     " --capacity 16GiB --alloc-conf expandable_segments:True")},
    "allocsim advise $S --capacity 20GiB": (
        "tests/test_advise.py::test_the_readme_advise_example_is_what_advise_prints",
        "checks the quoted output line for line, with --fast (150 timed replays take minutes)"),
    "allocsim report $S --policy pytorch --policy pytorch:expandable_segments:True --capacity 20GiB -o report.html": (
        "tests/test_report.py::oom_report", "the page the browser test opens and the screenshot is taken of"),
    "allocsim capture -o train.parquet --steps 4 -- python train.py --batch 64": (
        "tests/test_torch_capture.py::test_cli_capture_runs_a_cuda_script_and_run_judges_it_on_a_gpu",
        "train.py is the user's script: the test captures one of its own (needs PyTorch)"),
    'allocsim run train.parquet --policy pytorch --gpu "RTX 3060"': (
        "tests/test_torch_capture.py::test_cli_capture_runs_a_cuda_script_and_run_judges_it_on_a_gpu",
        "replays that test's capture on the RTX 3060"),
    'allocsim advise train.parquet --gpu "RTX 3060"': (
        "tests/test_capture_cli.py::test_advise_takes_gpu_or_capacity_not_both", "advise --gpu on a small trace"),
    "python -m validate snapshots --repos repos --extract-from clones --work snapshot-work": (
        "tests/test_snapshot_captures.py::test_cherryni_small_128_meets_the_targets",
        "needs the public repositories cloned beside it (not in CI) and minutes; the test runs one recipe"),
    "allocsim fit -- python traces/fit_example.py --batch {B}": (
        "tests/test_fit.py::test_fit_on_the_shipped_script_matches_direct_captures",
        "captures with PyTorch and searches three GPUs (under a minute); the test runs it with --json and checks "
        "each answer against direct captures"),
    "allocsim capture -o job -- torchrun --nproc-per-node 8 train.py --batch 4": (
        "tests/test_distributed_capture.py::job8",
        "train.py is the user's script: the fixture captures a DDP + FSDP2 script under torchrun at 8 ranks"),
    "allocsim run job --policy pytorch --gpu H100": (
        "tests/test_distributed_capture.py::test_run_answers_per_rank_and_names_the_limiting_rank",
        "runs it on that test's folder, text and --json"),
    "allocsim fit -- torchrun --nproc-per-node 8 train.py --batch {B}": (
        "tests/test_distributed_capture.py::test_fit_on_a_torchrun_job_answers_per_role_with_the_limiting_rank",
        "the test fits a DDP script of its own under torchrun (2 ranks, captures take seconds each)"),
    "allocsim advise job --gpu H100": (
        "tests/test_distributed_capture.py::test_advise_searches_the_limiting_rank_and_checks_every_role",
        "advise on that test's folder (--fast)"),
    "allocsim report job -o report.html": (
        "tests/test_distributed_capture.py::test_report_writes_one_page_per_role", "one page per role of that folder"),
    "allocsim capture -o train.parquet -- ~/envs/train/bin/python train.py --batch 64": (
        "tests/test_torch_versions.py::test_a_capture_in_the_training_interpreter_names_its_torch_and_run_gpu_notes_another",
        "train.py and its venv are the user's: the test captures its own script with an interpreter given by path"),
    "allocsim run train.parquet --policy pytorch --gpu H100 --torch 2.6": (
        "tests/test_torch_versions.py::test_a_capture_in_the_training_interpreter_names_its_torch_and_run_gpu_notes_another",
        "replays that test's capture with --torch and checks the verdict's note"),
    "allocsim fit --gpu H100 -- ~/envs/train/bin/python train.py --batch {B}": (
        "tests/test_fit.py::test_fit_on_the_shipped_script_matches_direct_captures",
        "fit with an interpreter given by path (sys.executable); the test checks the answer names its torch"),
    "python -m validate torch-env 2.6.0 torch-2.6": (
        "tests/test_torch_versions.py::test_torch_env_reads_requirements_and_maps_libraries_to_packages",
        "downloads a torch release and its NVIDIA libraries (GBs): the test checks how it picks them"),
    ("python -m validate torch-matrix --python torch-2.4/bin/python --python torch-2.6/bin/python --python "
     "torch-2.9/bin/python --python torch-2.13/bin/python --python torch-2.15/bin/python --repos repos "
     "--extract-from clones --work torch-matrix-work"): (
        "tests/test_torch_versions.py::test_torch_matrix_marks_the_recordings_release_and_counts_exact_rows",
        "needs five torch installs and the public repositories (an hour on 2 cores): the test checks its table"),
    "python -m validate calibrate --backend host -o calibration.json": (
        "tests/test_validate_host.py::host_calibration", "takes minutes; the test runs it with --quick"),
    ("python -m validate addresses ../shared/traces/pytorch-snapshots/*.pickle "
     "../shared/traces/scale-series/*.pickle ../shared/traces/state-only-snapshots/*.pickle"): (
        "tests/test_driver_addresses.py::test_the_evidence_command_gives_the_documented_figures",
        "the shell expands its globs; the test measures the same files and checks the figures docs/addresses.md quotes"),
    "python -m validate replay traces/bert_fp32.json.gz --policy pytorch,cupy --backend host --json": (
        "tests/test_validate_host.py::test_replay_command_json_and_reports",
        "replays on real host memory; the test runs these policies and more and checks the JSON"),
}


@dataclass
class Command:
    """One command of a bash block: its text as written, the output lines quoted under it, its line number."""

    text: str
    line: int
    expected: list[str] = field(default_factory=list)


@dataclass
class Block:
    """A fenced ``bash`` block of one page: shell variables it sets, and its commands in order."""

    page: str
    line: int
    variables: dict[str, str] = field(default_factory=dict)
    commands: list[Command] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def fenced(text: str, language: str) -> list[tuple[int, str]]:
    """(line number of the first line, body) of every ```LANGUAGE block."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1))
            for m in re.finditer(rf"(?ms)^```{language}\n(.*?)^```", text)]


def bash_blocks() -> list[Block]:
    """Every ``bash`` block of README.md and docs/*.md with the ``allocsim`` and ``python -m`` commands in it."""
    blocks = []
    for path in doc_pages():
        page = str(path.relative_to(ROOT))
        for first, body in fenced(path.read_text(encoding="utf-8"), "bash"):
            block = Block(page, first)
            lines = body.replace("\\\n", " ").splitlines()
            for number, line in enumerate(lines, first):
                if line.startswith("# ") and block.commands:
                    block.commands[-1].expected.append(line[2:])
                    continue
                if m := re.fullmatch(r"([A-Z]\w*)=(\S+)", line.strip()):
                    block.variables[m[1]] = m[2]
                    continue
                code = re.split(r"\s+#\s", line, maxsplit=1)[0]       # a comment after the command
                for part in code.split("&&"):
                    part = " ".join(part.split())
                    if part.startswith(("allocsim ", "python -m ")):
                        block.commands.append(Command(part, number))
            if block.commands:
                blocks.append(block)
    return blocks


BLOCKS = bash_blocks()


def to_run(block: Block) -> list[Command]:
    return [c for c in block.commands if c.text not in COVERED]


def argv_of(command: Command, variables: dict[str, str]) -> list[str]:
    """The command's words with its variables expanded and repository paths made absolute."""
    words = shlex.split(re.sub(r"\$(\w+)", lambda m: variables[m[1]], command.text))
    out = []
    for word in words:
        for prefix, base in (("traces/", ROOT / "traces"), ("../shared/", SHARED_DIR)):
            if word.startswith(prefix):
                if not base.is_dir():
                    pytest.skip(f"{base} is absent")
                word = str(base / word[len(prefix):])
        out.append(word)
    return out


def matches(expected: str, printed: list[str]) -> bool:
    """``TEXT`` is a printed line; ``TEXT ...`` the start of one."""
    if expected.endswith("..."):
        return any(line.startswith(expected[:-3].rstrip()) for line in printed)
    return expected in printed


def test_docs_show_commands_in_bash_blocks():
    """The extraction finds the pages' commands (an empty list would make every check below pass)."""
    texts = [c.text for b in BLOCKS for c in b.commands]
    assert len(texts) >= 25 and {"README.md", "docs/capture.md", "docs/fidelity.md"} <= {b.page for b in BLOCKS}
    assert "allocsim run traces/bert_fp32.json.gz --policy pytorch --capacity 4GiB" in texts


def test_every_covered_command_is_in_the_docs_and_its_test_exists():
    """COVERED names real commands and real tests, so it cannot rot into excuses for commands that are gone."""
    shown = {c.text for b in BLOCKS for c in b.commands}
    assert sorted(set(COVERED) - shown) == []
    for command, (test, why) in COVERED.items():
        file, name = test.split("::")
        source = (ROOT / file).read_text(encoding="utf-8")
        assert re.search(rf"^def {name}\(", source, re.M), f"{command}: {test} does not exist"
        assert why


def test_the_readme_opens_with_exactly_two_commands():
    first = fenced((ROOT / "README.md").read_text(encoding="utf-8"), "bash")[0][1].splitlines()
    assert first == ["pip install . && allocsim run traces/bert_fp32.json.gz --policy pytorch --capacity 4GiB",
                     "pip install -e '.[test]' && python -m pytest -q"]


def test_capture_is_installed_after_the_cpu_build_of_torch():
    """`.[capture]` alone lets pip pick PyPI's CUDA build of torch (about 6 GB): the docs install the CPU build first."""
    [(_, block), *_] = fenced((ROOT / "docs" / "capture.md").read_text(encoding="utf-8"), "bash")
    lines = block.splitlines()
    [extra] = [i for i, line in enumerate(lines) if line.startswith("pip install -e '.[capture]'")]
    cpu = [i for i, line in enumerate(lines) if line.startswith("pip install torch")
           and "--index-url https://download.pytorch.org/whl/cpu" in line]
    assert cpu and cpu[0] < extra
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "--index-url\nhttps://download.pytorch.org/whl/cpu" in readme or "--index-url https://download.pytorch.org/whl/cpu" in readme


def test_papermill_comes_with_an_extra_the_notebook_docs_install():
    """The documented way to run a notebook on your own file (papermill) is installed by `.[notebooks]`."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    extra = re.search(r"^notebooks = \[(.*)\]", pyproject, re.M)
    assert extra and '"papermill' in extra[1] and '"ipykernel' in extra[1]
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert "pip install -e '.[notebooks]'" in api and "papermill 04_fixing_an_oom.ipynb" in api


def test_ci_runs_the_readme_test_command():
    """.ci/run runs the README's test command verbatim, and then the suites the default one leaves out."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -e '.[test]' && python -m pytest -q\n" in ci
    assert re.search(r"^python -m pytest -q -m full$", ci, re.M)


def readme_verdict() -> str:
    """The verdict the README's prose says its first command ends with."""
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    return re.search(r"ending with the verdict: `([^`]+)`", text)[1]


#: Blocks with one of these commands take seconds each: CI's full suite runs them, the fast one the others.
HEAVY = ("allocsim sweep ", "allocsim advise ", "allocsim report ", "allocsim scale ", "python -m ")


def block_param(block: Block):
    heavy = any(c.text.startswith(HEAVY) for c in to_run(block))
    return pytest.param(block, id=block.id, marks=[pytest.mark.full] if heavy else [])


@pytest.mark.parametrize("block", [block_param(b) for b in BLOCKS if to_run(b)])
def test_bash_block_runs_and_prints_what_it_quotes(block, tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)                                   # outputs (-o) land here
    monkeypatch.setenv("ALLOCSIM_CACHE_DIR", str(tmp_path / "cache"))
    for command in to_run(block):
        argv = argv_of(command, block.variables)
        if argv[0] == "allocsim":
            code, out, err = cli(*argv[1:])
        else:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
            done = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, env=env, timeout=300)
            code, out, err = done.returncode, done.stdout, done.stderr
        where = f"{block.page}:{command.line}: {command.text}"
        assert code == 0 and "Traceback" not in err, f"{where}\nexit {code}\n{err}"
        printed = [line.rstrip() for line in (out + err).splitlines()]
        expected = list(command.expected)
        if command.text == "allocsim run traces/bert_fp32.json.gz --policy pytorch --capacity 4GiB":
            expected.append(readme_verdict())
        missing = [line for line in expected if not matches(line.rstrip(), printed)]
        assert not missing, f"{where}: not printed: {missing}\n{out}"


PYTHON_BLOCKS = [(f"{p.relative_to(ROOT)}:{n}", body) for p in doc_pages()
                 for n, body in fenced(p.read_text(encoding="utf-8"), "python")]


@pytest.mark.parametrize("first,body", PYTHON_BLOCKS, ids=[first for first, _ in PYTHON_BLOCKS])
def test_python_block_runs(first, body, monkeypatch):
    monkeypatch.chdir(ROOT)                                      # its paths are the repository's
    exec(compile(body, first, "exec"), {"__name__": "docs_example"})
