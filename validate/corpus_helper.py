"""Run inside the corpus interpreter: make a recipe's synthetic inputs, or count its model's tensors.

``python corpus_helper.py inputs SPEC_JSON`` writes the data files a recipe's script reads (MNIST
files, token streams, text, an image folder, a byte-level tokenizer) so that no script downloads
anything. ``python corpus_helper.py arithmetic SPEC_JSON`` builds the model the script builds, from
the same configuration, in this separate process (on the meta device where its constructor allows,
else on the CPU) and prints, as JSON, every distinct parameter and buffer: elements, bytes per
element, whether it takes a gradient. ``python -m validate corpus`` turns these into the bytes a
capture's ``parameter``, ``gradient`` and ``optimizer_state`` categories must hold.

It imports only what the corpus interpreter has (torch, the scripts' libraries), never allocsim:
the interpreter after ``allocsim capture --`` needs torch and nothing else.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import struct
import sys
from pathlib import Path
from typing import Any

#: Words of the synthetic text (plain ASCII: every tokenizer takes it).
_WORDS = ("the model reads a line of text and predicts the next token while the allocator keeps "
          "blocks of memory for every tensor it makes during the forward and backward pass").split()


# ---------------------------------------------------------------------------------------------- inputs
def _text(n_bytes: int, seed: int = 0) -> str:
    """``n_bytes`` of deterministic lines of words."""
    out, size, i = [], 0, seed
    while size < n_bytes:
        line = " ".join(_WORDS[(i * 7 + k * 3) % len(_WORDS)] for k in range(12)) + "\n"
        out.append(line)
        size += len(line)
        i += 1
    return "".join(out)[:n_bytes]


def _idx(path: Path, dims: list[int], fill: bytes) -> None:
    """An IDX file (the MNIST format): magic 0x0000 08 NDIM, big-endian dims, uint8 data."""
    count = 1
    for d in dims:
        count *= d
    with open(path, "wb") as fh:
        fh.write(bytes([0, 0, 8, len(dims)]) + struct.pack(f">{len(dims)}I", *dims))
        fh.write((fill * (count // len(fill) + 1))[:count])


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (the published byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def make_input(spec: dict[str, Any], root: Path) -> str:
    """Write one input of ``spec`` under ``root``; a line saying what was written."""
    kind, path = spec["kind"], root / spec["path"]
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "text":
        head = spec.get("head", "")   # text the script needs verbatim (minGPT's chargpt samples from "O God, O God!")
        path.write_text(head + _text(int(spec["bytes"]) - len(head)), encoding="ascii")
    elif kind == "tokens":
        import numpy as np
        rng = np.random.default_rng(0)
        rng.integers(0, int(spec["vocab"]), int(spec["count"]), dtype=np.uint16).tofile(path)
    elif kind == "pickle":
        import pickle
        with open(path, "wb") as fh:
            pickle.dump(_char_meta(int(spec["vocab"])) if spec.get("char_meta") else spec["value"], fh)
    elif kind == "mnist":
        raw = path / "MNIST" / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        for prefix, n in (("train", int(spec.get("train", 60000))), ("t10k", int(spec.get("test", 10000)))):
            _idx(raw / f"{prefix}-images-idx3-ubyte", [n, 28, 28], bytes(range(0, 256, 3)))
            _idx(raw / f"{prefix}-labels-idx1-ubyte", [n], bytes(range(10)))
    elif kind == "hf_checkpoint":
        _hf_checkpoint(path, spec["config"], spec.get("dtype", "bfloat16"))
    elif kind == "imagefolder":
        from PIL import Image
        size = int(spec.get("size", 64))
        for split in spec.get("splits", ["train", "val"]):
            for c in range(int(spec.get("classes", 2))):
                folder = path / split / f"class{c}"
                folder.mkdir(parents=True, exist_ok=True)
                for k in range(int(spec.get("per_class", 8))):
                    shade = (40 * c + 7 * k) % 256
                    Image.new("RGB", (size, size), (shade, 255 - shade, (3 * shade) % 256)).save(folder / f"{k}.png")
    elif kind == "bytelevel_tokenizer":
        path.mkdir(parents=True, exist_ok=True)
        vocab = {ch: i for i, ch in enumerate(_bytes_to_unicode().values())}
        vocab["<|endoftext|>"] = len(vocab)
        (path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        (path / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
        (path / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "GPT2Tokenizer", "model_max_length": int(spec.get("model_max_length", 1024)),
            "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
            "add_prefix_space": False}), encoding="utf-8")
    else:
        raise ValueError(f"unknown input kind {kind!r}")
    return f"{kind}: {spec['path']}"


def _hf_checkpoint(folder: Path, config: dict[str, Any], dtype_name: str) -> None:
    """A Hugging Face checkpoint folder of zeros (``config.json``, ``model.safetensors``) for a published config.

    The script under capture never reads the values (the capture computes nothing); its checkpointer
    needs the file's names and shapes, which the model class built from ``config`` on the meta device gives.
    """
    import torch
    import transformers
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    cfg = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    dtype = getattr(torch, dtype_name)
    tensors = {name: torch.zeros(t.shape, dtype=dtype) for name, t in model.state_dict().items()
               if not (config.get("tie_word_embeddings") and name == "lm_head.weight")}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


def _char_meta(vocab: int) -> dict[str, Any]:
    """nanoGPT's ``meta.pkl`` for a character vocabulary of ``vocab`` symbols."""
    chars = [chr(32 + i) for i in range(vocab)]
    return {"vocab_size": vocab, "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}


# ---------------------------------------------------------------------------------------------- arithmetic
def _script_namespace(script: Path, names: list[str], preset: dict[str, Any]) -> dict[str, Any]:
    """The imports and the named classes/functions of ``script``, executed without running the script.

    Only ``import`` statements and the definitions named are taken from the script's syntax tree, so
    the model classes are the script's own code while its training loop never runs.
    """
    tree = ast.parse(script.read_text(encoding="utf-8"))
    keep = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
            or (isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in names)]
    missing = set(names) - {n.name for n in keep if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    if missing:
        raise ValueError(f"{script}: no definition of {sorted(missing)}")
    namespace: dict[str, Any] = {"__name__": "corpus_arithmetic", **preset}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(script), "exec"), namespace)  # noqa: S102
    return namespace


def _build(spec: dict[str, Any], tree: Path) -> list[Any]:
    """The modules a recipe's script builds, as its ``arithmetic`` spec says how."""
    kind = spec["kind"]
    if kind == "torchvision":
        import torchvision
        return [torchvision.models.get_model(spec["arch"], **spec.get("kwargs", {}))]
    if kind == "timm":
        import timm
        return [timm.create_model(spec["model"], **spec.get("kwargs", {}))]
    if kind == "hf_causal_lm":
        import transformers
        config = transformers.CONFIG_MAPPING[spec["model_type"]]()
        if spec.get("overrides"):
            config.update_from_string(spec["overrides"])
        model = transformers.AutoModelForCausalLM.from_config(config)
        # run_clm.py resizes only to a larger tokenizer; accelerate's example resizes always (``resize_always``)
        rows = model.get_input_embeddings().weight.shape[0]
        if spec.get("resize_to") and (rows < int(spec["resize_to"]) or spec.get("resize_always")):
            model.resize_token_embeddings(int(spec["resize_to"]))
        return [model]
    if kind == "expression":
        for folder in spec.get("pythonpath", []):
            sys.path.insert(0, str((tree / folder).resolve()))
        namespace: dict[str, Any] = {}
        if spec.get("script"):
            namespace = _script_namespace(tree / spec["script"], spec.get("definitions", []), spec.get("globals", {}))
        for line in spec.get("imports", []):
            exec(line, namespace)  # noqa: S102
        return [eval(expr, namespace) for expr in spec["build"]]  # noqa: S307
    raise ValueError(f"unknown arithmetic kind {kind!r}")


def arithmetic(spec: dict[str, Any], tree: Path) -> dict[str, Any]:
    """Every distinct parameter and buffer of the built modules: ``[elements, bytes per element, trainable]``."""
    import torch

    def build() -> list[Any]:
        return _build(spec, tree)

    # A script that builds its model under another default dtype (torchtune: ``training.set_default_dtype``)
    # is followed the same way, so tensors its code makes float32 on purpose (RoPE caches) stay float32.
    default = torch.get_default_dtype()
    if spec.get("default_dtype"):
        torch.set_default_dtype(getattr(torch, spec["default_dtype"]))
    how = "meta"
    try:
        try:
            with torch.device("meta"):
                modules = build()
        except Exception as exc:   # a constructor that reads values back (.item()) needs real tensors
            how = f"cpu ({type(exc).__name__} on meta)"
            modules = build()
    finally:
        torch.set_default_dtype(default)
    dtype = getattr(torch, spec["dtype"]) if spec.get("dtype") else None
    frozen = tuple(spec.get("frozen", ()))
    trainable_if = tuple(spec.get("trainable_if", ()))   # e.g. LoRA: only names with "lora_" train
    params, buffers, seen = [], [], set()
    for module in modules:
        for name, p in module.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            size = torch.empty((), dtype=dtype).element_size() if dtype and p.is_floating_point() else p.element_size()
            trains = bool(p.requires_grad) and not (frozen and name.startswith(frozen))
            if trainable_if:
                trains = trains and any(part in name for part in trainable_if)
            params.append([p.numel(), size, trains])
        for b in module.buffers():
            if id(b) in seen:
                continue
            seen.add(id(b))
            size = torch.empty((), dtype=dtype).element_size() if dtype and b.is_floating_point() else b.element_size()
            buffers.append([b.numel(), size])
    return {"params": params, "buffers": buffers, "built_on": how, "torch": torch.__version__}


def main(argv: list[str]) -> int:
    """``inputs SPEC_JSON`` or ``arithmetic SPEC_JSON``; SPEC_JSON holds ``root``/``tree`` and the spec."""
    command, payload = argv[0], json.loads(argv[1])
    if command == "inputs":
        root = Path(payload["root"])
        for spec in payload["inputs"]:
            print(make_input(spec, root))
        return 0
    if command == "arithmetic":
        os.chdir(payload["tree"])
        with contextlib.redirect_stdout(sys.stderr):   # a module that prints while it is built
            result = arithmetic(payload["spec"], Path(payload["tree"]))
        print(json.dumps(result))
        return 0
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
