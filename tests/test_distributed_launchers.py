"""Framework launchers read as their own code reads them (``allocsim.torch_capture.distributed.launchers``).

DeepSpeed's runner (deepspeed/launcher/runner.py ``parse_args``) and per-node launcher
(deepspeed/launcher/launch.py ``main``): ranks numbered node x GPUs per node + local rank,
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_SIZE``, ``CROSS_RANK``, ``CROSS_SIZE``,
``MASTER_PORT``, and ``--local_rank=N`` before the script's arguments unless ``--no_local_rank``.
"""

from __future__ import annotations

import pytest

from allocsim.torch_capture.distributed.launcher import LaunchError
from allocsim.torch_capture.distributed.launchers import parse_launch


def test_the_deepspeed_launcher_is_read_as_its_runner_reads_it():
    from allocsim.torch_capture.distributed.launcher import LaunchError
    from allocsim.torch_capture.distributed.launchers import parse_launch

    launch = parse_launch(["deepspeed", "--num_gpus", "4", "--num_nodes", "2", "--master_port", "1234", "t.py", "--x"])
    assert launch.launcher == "deepspeed" and launch.world_size == 8
    env = launch.rank_env(5)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE",
                                "MASTER_PORT")} == {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8",
                                                    "LOCAL_SIZE": "4", "CROSS_RANK": "1", "CROSS_SIZE": "2",
                                                    "MASTER_PORT": "1234"}
    assert launch.rank_command(5)[1:] == ["t.py", "--local_rank=1", "--x"]
    assert parse_launch(["deepspeed", "--num_gpus", "2", "--no_local_rank", "--module", "pkg.train"]
                        ).rank_command(1)[1:] == ["-m", "pkg.train"]
    assert parse_launch(["deepspeed", "--include", "localhost:0,2,5", "t.py"]).world_size == 3
    for bad, says in ((["deepspeed", "t.py"], "--num_gpus"), (["deepspeed", "--num_gpus", "2", "--autotuning", "tune",
                                                                "t.py"], "autotuning")):
        with pytest.raises(LaunchError, match=says):
            parse_launch(bad)


def test_tune_and_accelerate_parsers_run_in_an_interpreter_without_allocsim(tmp_path, monkeypatch):
    """``tune run`` / ``accelerate launch`` are read in the launcher's own interpreter, which need not have allocsim.

    Regression: the helpers ran as ``python -m allocsim.torch_capture.distributed.<helper>`` there, so a ``tune`` from
    another virtual environment (the torchtune one) stopped at ``No module named 'allocsim'`` before torchtune's parser
    ran. The helper now runs by its file path; here the interpreter has no site-packages at all (``-S``), so the
    helper itself runs and answers with the framework it cannot import.
    """
    import sys

    from allocsim.torch_capture.distributed.hf import parse_accelerate
    from allocsim.torch_capture.distributed.tune_launch import parse_tune

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    for name in ("tune", "accelerate"):
        (bin_dir / name).write_text(f"#!{python}\nraise SystemExit('the launcher itself is never run')\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.chdir(tmp_path)                  # not the repository: ``allocsim`` is not importable from the cwd
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with pytest.raises(LaunchError) as tune_err:
        parse_tune([str(bin_dir / "tune"), "run", "--nproc_per_node", "2", "full_finetune_distributed",
                    "--config", "qwen2_5/0.5B_full"])
    assert "allocsim" not in str(tune_err.value)
    assert "No module named 'torch" in str(tune_err.value)          # torchtune's parser was reached
    with pytest.raises(LaunchError) as acc_err:
        parse_accelerate([str(bin_dir / "accelerate"), "launch", "--num_processes", "2", "train.py"])
    assert "allocsim" not in str(acc_err.value)
    assert "No module named 'accelerate" in str(acc_err.value)
