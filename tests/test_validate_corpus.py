"""``python -m validate corpus``: recipes, file hashing, the model arithmetic and the table (validate/corpus*.py).

The fast tests need no corpus interpreter: they check the recipes, the change detection, the
helper's inputs and its arithmetic in this interpreter. The ``full`` test captures a six-line
training script of a temporary "repository" end to end, with this interpreter as the corpus one.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys

import pytest

from validate import corpus
from validate import corpus_helper as helper


# ---------------------------------------------------------------------------------------------- recipes
def test_recipes_pin_at_least_25_configurations_with_what_they_cover():
    table = corpus.load_recipes()
    configs = table["configurations"]
    assert len(configs) >= 25
    repos = {c["repo"] for c in configs.values()}
    for wanted in ("pytorch/examples", "karpathy/nanoGPT", "karpathy/minGPT", "huggingface/transformers",
                   "huggingface/accelerate", "huggingface/pytorch-image-models", "Lightning-AI/pytorch-lightning",
                   "pytorch/torchtune"):
        assert wanted in repos
    features = " ".join(c["features"] for c in configs.values())
    for wanted in ("fp32", "bf16", "fp16", "GradScaler", "torch.compile", "fused AdamW", "foreach",
                   "gradient accumulation", "activation checkpointing"):
        assert wanted in features, wanted
    for name, cfg in configs.items():
        assert len(cfg["script_sha256"]) == 64, name
        assert cfg["arithmetic"]["kind"] in ("torchvision", "timm", "hf_causal_lm", "expression"), name
        for arg in cfg.get("args", []):
            rest = arg
            for key in ("{tree}", "{data}", "{out}"):
                rest = rest.replace(key, "")
            assert "{" not in rest or "=" in rest, (name, arg)     # only the three places are expanded


def test_a_recipe_without_a_pinned_commit_is_refused(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"configurations": {"x": {"repo": "a/b", "commit": "main", "script": "t.py", "steps": 1,
                                                          "arithmetic": {}, "optimizer": {}}}}))
    with pytest.raises(ValueError, match="40 hex digits"):
        corpus.load_recipes(path)


def test_a_missing_tree_or_a_different_script_is_a_row_not_a_crash(tmp_path):
    cfg = dict(corpus.load_recipes()["configurations"]["examples-mnist"])
    out = corpus.run_capture("examples-mnist", cfg, tmp_path / "repos", tmp_path / "work", sys.executable)
    assert out.trace is None and out.error.startswith("not extracted: pytorch+examples/mnist/main.py")
    script = tmp_path / "repos" / "pytorch+examples" / "mnist" / "main.py"
    script.parent.mkdir(parents=True)
    script.write_text("print('not the pinned file')\n")
    out = corpus.run_capture("examples-mnist", cfg, tmp_path / "repos", tmp_path / "work", sys.executable)
    assert out.trace is None and "not the pinned file: mnist/main.py is not the recipe's" in out.error


# ---------------------------------------------------------------------------------------------- files
def test_changed_files_lists_created_changed_and_removed_but_not_pycache(tmp_path):
    (tmp_path / "keep.txt").write_text("a")
    (tmp_path / "edit.txt").write_text("a")
    (tmp_path / "gone.txt").write_text("a")
    before = corpus.hash_files([tmp_path])
    (tmp_path / "edit.txt").write_text("b")
    (tmp_path / "gone.txt").unlink()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.pt").write_bytes(b"\0")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "m.pyc").write_bytes(b"\0")
    after = corpus.hash_files([tmp_path])
    assert corpus.changed_files(before, after, tmp_path) == ["created ckpt/model.pt", "changed edit.txt",
                                                             "removed gone.txt"]


# ---------------------------------------------------------------------------------------------- arithmetic
def test_expected_bytes_follow_the_optimizer():
    counts = {"params": [[10, 4, True], [6, 4, False], [3, 2, True]], "buffers": [[2, 8]]}
    trainable = 10 * 4 + 3 * 2
    assert corpus.expected_bytes(counts, {"states": 2}) == {
        "parameter": 40 + 24 + 6 + 16, "gradient": trainable, "optimizer_state": 2 * trainable}
    # fused / capturable Adam keep a float32 step per trainable tensor on the device (torch/optim/adam.py)
    assert corpus.expected_bytes(counts, {"states": 2, "device_step": True})["optimizer_state"] == 2 * trainable + 8
    assert corpus.expected_bytes(counts, {"states": 0})["optimizer_state"] == 0


def test_helper_counts_distinct_tensors_of_the_script_s_own_classes(tmp_path):
    if not os.environ.get("CI"):              # the helper builds the model on meta: it needs torch (CI has it)
        pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch import nn\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.emb = nn.Embedding(11, 4)\n"
        "        self.head = nn.Linear(4, 11, bias=False)\n"
        "        self.head.weight = self.emb.weight          # tied: counted once\n"
        "        self.norm = nn.BatchNorm1d(4)\n"
        "        self.lora_a = nn.Linear(4, 2, bias=False)\n"
        "raise SystemExit('the training loop must not run')\n")
    spec = {"kind": "expression", "script": "train.py", "definitions": ["Net"], "build": ["Net()"]}
    counts = helper.arithmetic(spec, tmp_path)
    assert counts["built_on"] == "meta"
    assert sorted(counts["params"]) == sorted([[44, 4, True], [4, 4, True], [4, 4, True], [8, 4, True]])
    assert sorted(counts["buffers"]) == sorted([[4, 4], [4, 4], [1, 8]])   # running mean, var, num_batches_tracked
    lora = helper.arithmetic(dict(spec, trainable_if=["lora_"], dtype="bfloat16"), tmp_path)
    assert sorted(lora["params"]) == sorted([[44, 2, False], [4, 2, False], [4, 2, False], [8, 2, True]])
    assert [1, 8] in lora["buffers"]     # an integer buffer keeps its dtype


def test_helper_inputs_are_what_the_scripts_read(tmp_path):
    helper.make_input({"kind": "mnist", "path": str(tmp_path / "data"), "train": 3, "test": 2}, tmp_path)
    raw = tmp_path / "data" / "MNIST" / "raw"
    images = (raw / "train-images-idx3-ubyte").read_bytes()
    assert images[:4] == bytes([0, 0, 8, 3]) and struct.unpack(">3I", images[4:16]) == (3, 28, 28)
    assert len(images) == 16 + 3 * 28 * 28
    assert struct.unpack(">I", (raw / "t10k-labels-idx1-ubyte").read_bytes()[4:8]) == (2,)
    helper.make_input({"kind": "tokens", "path": str(tmp_path / "t.bin"), "count": 100, "vocab": 65}, tmp_path)
    tokens = (tmp_path / "t.bin").read_bytes()
    assert len(tokens) == 200 and max(struct.unpack("<100H", tokens)) < 65
    helper.make_input({"kind": "text", "path": str(tmp_path / "in.txt"), "bytes": 500, "head": "O God!\n"}, tmp_path)
    text = (tmp_path / "in.txt").read_text()
    assert len(text) == 500 and text.startswith("O God!\n")
    helper.make_input({"kind": "bytelevel_tokenizer", "path": str(tmp_path / "tok")}, tmp_path)
    vocab = json.loads((tmp_path / "tok" / "vocab.json").read_text(encoding="utf-8"))
    assert len(vocab) == 257 and vocab["<|endoftext|>"] == 256 and vocab["!"] == 0


# ---------------------------------------------------------------------------------------------- table
def _row(**kw):
    row = {"name": "n", "repo": "o/r", "commit": "a" * 40, "script": "s.py", "features": "fp32", "unchanged": True,
           "complete": True, "steps": 2, "seconds": 12.3, "rss_kib": 2048, "error": "", "changed": [],
           "peak_allocated_bytes": 3 * 2**20, "peak_reserved_bytes": 4 * 2**20,
           "categories": {"parameter": 2**20, "gradient": 2**20, "optimizer_state": 0},
           "expected": {"parameter": 2**20, "gradient": 2**20, "optimizer_state": 0}}
    row.update(kw)
    row["match"] = {c: row["categories"][c] == row["expected"][c] for c in corpus.COMPARED}
    return row


def test_table_says_exact_or_both_figures_and_why_a_script_failed():
    rows = [_row(), _row(name="m", unchanged=False, complete=False, error="the script raised RuntimeError: a|b",
                         categories={"parameter": 2**20, "gradient": 0, "optimizer_state": 0},
                         changed=["created tree/out/ckpt.pt"])]
    text = corpus.format_table(rows)
    assert "| n | o/r/s.py @ aaaaaaaa | fp32 | yes | yes | 2 | 12 | 2.0 | 3.0 | 4.0 | P 1.0 =; G 1.0 =; O 0.0 = | none |" in text
    assert "**no**: the script raised RuntimeError: a\\|b" in text
    assert "G 0.0 vs 1.0" in text and "1: created tree/out/ckpt.pt" in text
    assert corpus.summarize(rows) == {"configurations": 2, "unchanged": 1, "complete": 1, "categories_exact": 1,
                                      "files_changed": 1}


def test_the_subcommand_is_registered():
    from validate.__main__ import build_parser
    args = build_parser().parse_args(["corpus", "--repos", "r", "--python", "p", "--only", "mnist"])
    assert args.command == "corpus" and args.only == ["mnist"]


# ---------------------------------------------------------------------------------------------- end to end
_SCRIPT = """import torch
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
opt = torch.optim.AdamW(model.parameters(), foreach=True)
for _ in range(3):
    model(torch.randn(32, 256, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.full
def test_a_script_of_a_pinned_tree_is_captured_and_matches_its_arithmetic(tmp_path):
    tree = tmp_path / "repos" / "someone+tiny"
    tree.mkdir(parents=True)
    (tree / "train.py").write_text(_SCRIPT)
    cfg = {"repo": "someone/tiny", "commit": "0" * 40, "script": "train.py", "steps": 2, "features": "fp32",
           "script_sha256": hashlib.sha256(_SCRIPT.encode()).hexdigest(),
           "arithmetic": {"kind": "expression", "imports": ["import torch"],
                          "build": ["torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))"]},
           "optimizer": {"states": 2}}
    rows = corpus.evaluate({"configurations": {"tiny": cfg}}, tmp_path / "repos", tmp_path / "work", sys.executable)
    row = rows[0]
    assert row["error"] == "" and row["unchanged"] and row["complete"] and row["steps"] == 2
    weights = (256 * 512 + 512 + 512 * 10 + 10) * 4
    assert row["expected"] == {"parameter": weights, "gradient": weights, "optimizer_state": 2 * weights}
    assert row["categories"]["parameter"] == weights and row["match"] == dict.fromkeys(corpus.COMPARED, True)
    assert row["changed"] == [] and row["rss_kib"] > 0 and row["peak_allocated_bytes"] >= 4 * weights
    again = corpus.run_capture("tiny", cfg, tmp_path / "repos", tmp_path / "work", sys.executable)
    assert again.reused and again.trace == row["trace"]


def test_an_input_outside_the_configuration_s_folder_is_refused(tmp_path):
    tree = tmp_path / "repos" / "someone+tiny"
    tree.mkdir(parents=True)
    (tree / "train.py").write_text("print('hi')\n")
    cfg = {"repo": "someone/tiny", "commit": "0" * 40, "script": "train.py", "steps": 1,
           "inputs": [{"kind": "text", "path": "{tree}/../../../escaped.txt", "bytes": 10}],
           "arithmetic": {"kind": "expression", "build": []}, "optimizer": {}}
    out = corpus.run_capture("tiny", cfg, tmp_path / "repos", tmp_path / "work", sys.executable)
    assert out.trace is None and "is not under the configuration's folder" in out.error
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "work" / "escaped.txt").exists()
