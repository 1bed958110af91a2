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
