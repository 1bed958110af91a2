"""``python -m validate torchtitan --python PY``: the ranks run under torchtitan's own interpreter."""

from __future__ import annotations

import argparse
import sys

from allocsim.torch_capture.distributed.launchers import parse_launch
from validate import torchtitan


def test_default_launch_is_the_launch_scripts_torchrun():
    assert torchtitan.launch_command(None, 1) == torchtitan.LAUNCH
    assert torchtitan.launch_command(None, 32)[:3] == ["torchrun", "--nnodes", "32"]


def test_python_runs_the_ranks_under_that_interpreter():
    python = "/envs/torch26/bin/python"
    command = torchtitan.launch_command(python, 32)
    assert command[:6] == [python, "-m", "torch.distributed.run", "--nnodes", "32", "--nproc_per_node=8"]
    launch = parse_launch([*command, "train.py", "--job.config_file", "./train_configs/llama3_70b.toml"])
    assert launch.python == python
    assert launch.world_size == 256
    assert launch.child_command()[:2] == [python, "train.py"]


def test_the_option_is_parsed():
    parser = argparse.ArgumentParser()
    torchtitan._arguments(parser)
    assert parser.parse_args(["--torchtitan", "t"]).python is None
    assert parser.parse_args(["--torchtitan", "t", "--python", sys.executable]).python == sys.executable
