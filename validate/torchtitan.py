"""torchtitan's Llama 3.1 rows, captured per rank on the CPU: ``python -m validate torchtitan --torchtitan DIR``.

The check of issue 36: ``pytorch/torchtitan`` at 9dec370a (2024-12-26, the commit its
``benchmarks/llama3_h100_202412_torchtitan.md`` names) run unchanged as its ``run_llama_train.sh``
runs it (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True torchrun --nproc_per_node=8 --rdzv_backend
c10d --rdzv_endpoint=localhost:0 --local-ranks-filter 0 --role rank --tee 3 train.py --job.config_file
CONFIG OVERRIDES``), with the table's overrides, on the H100 of that benchmark (96 GB, ``--gpu "H100 96GB"``).
The table's "Memory(GiB)" is torchtitan's ``max_reserved_gib``: ``memory_stats()["reserved_bytes.all.peak"]``
/ 2**30 (``DeviceMemoryMonitor.get_peak_stats`` in torchtitan/metrics.py at that commit), since the last
``reset_peak_memory_stats`` (each log, every 10 steps; the table reads step 90), max over ranks -- so
the comparison is ``allocsim run``'s peak reserved of the limiting rank with the launch script's
``expandable_segments:True``, in GiB.

What the checkout needs that the commit does not ship (nothing is downloaded):

* the Llama 3.1 tokenizer (``torchtitan/datasets/tokenizer/original/tokenizer.model``, a download): a
  stand-in made from the commit's own ``tests/assets/test_tiktoken.model`` padded with distinct byte
  strings to Llama 3's 128,000 base tokens, so ``TikTokenizer.n_words`` -- the vocabulary the model is
  built with -- is 128,256 as with the real one; which tokens a text becomes does not change memory;
* the ``c4_test`` data set (``tests/assets/c4_test/data.json``, not in the stored copy of the
  repository): 2,000 lines of generated text; the loader packs tokens into ``seq_len + 1`` rows whatever
  the text (``HuggingFaceDataset.__iter__``), and the row ``--training.dataset c4_test`` replaces the
  hub's ``c4``;
* the data set's Hugging Face cache, built once outside the capture (``load_dataset`` memory-maps it
  with pyarrow, whose file opens the capture's write guard cannot redirect).

Which kernel: torch 2.13 puts cuDNN attention first on compute capability 9.0
(``check_prefer_cudnn_attention``), the benchmark's torch (2024-12-23) put flash attention first, and
torchtitan's selective activation checkpointing saves flash's output but recomputes cuDNN's. Rows run
with ``TORCH_CUDNN_SDPA_DEPRIORITIZED=1`` (flash first, as then) and without (2.13's own choice).
"""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys
import tempfile

#: The torchtitan commit of the benchmark table.
COMMIT = "9dec370ad26b5f8e9a7333a0e36165018262644b"
#: Llama 3's base tokens (the tokenizer adds 256 special ones).
BASE_TOKENS = 128000
LAUNCH = ["torchrun", "--nproc_per_node=8", "--rdzv_backend", "c10d", "--rdzv_endpoint=localhost:0",
          "--local-ranks-filter", "0", "--role", "rank", "--tee", "3"]

#: The table's rows: (name, recorded GiB, nodes, config, overrides, what the capture cannot follow).
ROWS = [
    ("8B FSDP (Table 1, 8 GPUs, local batch 2, selective AC)", 82.4, 1, "llama3_8b.toml",
     ["--training.batch_size", "2"], ""),
    ("70B FSDP 32 x TP 8 (Table 4 '2D', compile + Float8)", 71.9, 32, "llama3_70b.toml",
     ["--training.batch_size", "16", "--training.compile", "--float8.enable_float8_linear",
      "--float8.enable_fsdp_float8_all_gather", "--float8.precompute_float8_dynamic_scale_for_fsdp"],
     "Float8: torchao of December 2024 (0.7.0) fails on torch 2.13's functional collectives "
     "(Float8Tensor has no _wrap_tensor_autograd); torchao 0.18 no longer has the ScalingType.DELAYED "
     "this commit's torchtitan/float8.py reads"),
    ("405B FSDP 8 x TP 8 x PP 8 1F1B (Table 5, compile + Float8 + AsyncTP)", 82.5, 64, "llama3_405b.toml",
     ["--training.batch_size", "32", "--experimental.pipeline_parallel_degree", "8",
      "--experimental.pipeline_parallel_schedule", "1F1B"],
     "Float8, as the 70B row"),
]


def make_assets(root: str, python: str = sys.executable) -> None:
    """The tokenizer stand-in and the c4_test stand-in (module doc), and the data set's cache (built by ``python``)."""
    ranks: dict[bytes, int] = {}
    with open(os.path.join(root, "tests/assets/test_tiktoken.model"), "rb") as fh:
        for line in fh:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    n, i = max(ranks.values()) + 1, 0
    while n < BASE_TOKENS:
        token = b"\xff\xfe" + i.to_bytes(3, "big")
        i += 1
        if token not in ranks:
            ranks[token] = n
            n += 1
    out = os.path.join(root, "torchtitan/datasets/tokenizer/original/tokenizer.model")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "wb") as fh:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            fh.write(base64.b64encode(token) + b" " + str(rank).encode() + b"\n")
    data = os.path.join(root, "tests/assets/c4_test/data.json")
    if not os.path.exists(data):
        os.makedirs(os.path.dirname(data), exist_ok=True)
        rng = random.Random(0)
        words = ["the", "of", "memory", "allocator", "training", "model", "data", "and", "a", "to", "in", "GPU"]
        with open(data, "w", encoding="utf-8") as fh:
            for _ in range(2000):
                fh.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(2000))}) + "\n")
    subprocess.run([python, "-c", "from datasets import load_dataset; load_dataset('tests/assets/c4_test', "
                    "split='train')"], cwd=root, check=True)


def launch_command(python: str | None, nodes: int) -> list[str]:
    """``torchrun`` of the launch script, or ``PYTHON -m torch.distributed.run``: the ranks run under that interpreter."""
    launcher = ["torchrun"] if python is None else [python, "-m", "torch.distributed.run"]
    return launcher + (["--nnodes", str(nodes)] if nodes > 1 else []) + LAUNCH[1:]


def run_row(root: str, row: tuple, work: str, flash_first: bool, steps: int, python: str | None = None) -> dict:
    """Capture one row (its ranks under ``python``, default the ``torchrun`` on PATH) and replay it; the
    limiting rank's peaks in GiB."""
    name, recorded, nodes, config, overrides, _why = row
    out = os.path.join(work, f"{config.split('.')[0]}{'-flash' if flash_first else ''}") + os.sep
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    if flash_first:
        env["TORCH_CUDNN_SDPA_DEPRIORITIZED"] = "1"
    launch = launch_command(python, nodes)
    command = [sys.executable, "-m", "allocsim", "capture", "--no-verify", "--gpu", "H100 96GB", "-o", out, "--",
               *launch, "train.py", "--job.config_file", f"./train_configs/{config}", *overrides,
               "--training.dataset", "c4_test", "--training.steps", str(steps)]
    captured = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    if captured.returncode != 0:
        return {"row": name, "recorded_gib": recorded, "flash_first": flash_first,
                "error": captured.stderr.strip().splitlines()[-1:]}

    def replay(*settings: str) -> dict:
        ran = subprocess.run([sys.executable, "-m", "allocsim", "run", out, "--policy", "pytorch", *settings,
                              "--gpu", "H100 96GB", "--json"], env=env, capture_output=True, text=True)
        report = json.loads(ran.stdout)
        return next(r for r in report["ranks"] if report["limiting_rank"] in r["ranks"])

    limiting = replay("--env-alloc-conf")            # the launch script's expandable_segments:True
    reserved = limiting["peak_reserved_bytes"] / 2**30
    # multinode_trainer.slurm, torchtitan's other launch script, sets no PYTORCH_CUDA_ALLOC_CONF
    default = replay()["peak_reserved_bytes"] / 2**30
    return {"row": name, "recorded_gib": recorded, "flash_first": flash_first,
            "peak_allocated_gib": round(limiting["peak_allocated_bytes"] / 2**30, 2),
            "peak_reserved_gib": round(reserved, 2), "error_pct": round(100 * (reserved - recorded) / recorded, 2),
            "peak_reserved_default_allocator_gib": round(default, 2),
            "error_default_allocator_pct": round(100 * (default - recorded) / recorded, 2)}


def _arguments(parser) -> None:
    parser.add_argument("--torchtitan", required=True, metavar="DIR", help=f"a checkout of pytorch/torchtitan at {COMMIT[:8]}")
    parser.add_argument("--work", default=None, metavar="DIR", help="where the capture folders go (default: a temporary one)")
    parser.add_argument("--rows", default="8B", help="comma-separated row names' first words (8B,70B,405B)")
    parser.add_argument("--steps", type=int, default=3, help="training steps captured (default 3)")
    parser.add_argument("--python", default=None, metavar="PYTHON",
                        help="the interpreter of torchtitan's environment (its torch, torchao and requirements): the "
                        "ranks run as PYTHON -m torch.distributed.run (default: the torchrun on PATH)")


def register(subparsers) -> None:
    """Add the ``torchtitan`` subcommand."""
    parser = subparsers.add_parser("torchtitan", help="torchtitan's Llama 3.1 rows captured per rank vs its benchmark "
                                   "table", description=__doc__.split("\n")[0])
    _arguments(parser)
    parser.set_defaults(func=_run)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m validate.torchtitan", description=__doc__.split("\n")[0])
    _arguments(parser)
    return _run(parser.parse_args(argv))


def _run(args) -> int:
    root = os.path.abspath(args.torchtitan)
    make_assets(root, args.python or sys.executable)
    work = args.work or tempfile.mkdtemp(prefix="torchtitan-rows-")
    os.makedirs(work, exist_ok=True)
    wanted = {w.strip() for w in args.rows.split(",")}
    for row in ROWS:
        if row[0].split()[0] not in wanted:
            continue
        for flash_first in (True, False):
            print(json.dumps(run_row(root, row, work, flash_first, args.steps, args.python)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
