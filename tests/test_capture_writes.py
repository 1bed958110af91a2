"""Under a real capture a script's torch.save, numpy.save, log, makedirs, removal and rename leave the user's files alone.

One capture (``allocsim capture`` as a user runs it, with ``--keep-writes``) of a script that saves a
checkpoint over the user's trained one each step and reloads it (a best-checkpoint reload), saves
metrics with numpy, appends to a log, makes a folder, removes and renames the user's files, and saves
with safetensors where it is installed. Every user file must be byte-identical after.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

if os.environ.get("CI"):
    import torch  # noqa: F401  (CI installs it: a missing torch must fail, not skip)
else:
    pytest.importorskip("torch")

pytestmark = pytest.mark.full      # one capture child (seconds)

SCRIPT = """
import importlib.util, os
import numpy as np
import torch
model = torch.nn.Linear(64, 64).cuda()
opt = torch.optim.AdamW(model.parameters())
for step in range(2):
    model(torch.randn(8, 64, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
    torch.save({"model": model.state_dict(), "step": step}, "out/model.pt")
    with open("train.log", "a") as log:
        log.write(f"step {step}\\n")
best = torch.load("out/model.pt")
model.load_state_dict(best["model"])
print("reloaded step", best["step"], flush=True)
np.save("out/metrics.npy", np.arange(10))
print("metrics", int(np.load("out/metrics.npy").sum()), flush=True)
os.makedirs("out/extra/deeper", exist_ok=True)
os.remove("old.txt")
os.rename("ren.txt", "renamed.txt")
if importlib.util.find_spec("safetensors") is not None:
    from safetensors.torch import load_file, save_file
    save_file({"w": torch.arange(4.0)}, "weights.safetensors")
    print("safetensors", load_file("weights.safetensors")["w"].tolist(), flush=True)
    # device tensors, one of 1 MiB whose host copy holds no bytes in a capture (accelerate's save_state)
    big, small = torch.ones(1 << 18, device="cuda"), torch.arange(4.0, device="cuda")
    save_file({"big": big, "small": small}, "device.safetensors", metadata={"format": "pt"})
    back = load_file("device.safetensors")
    print("device safetensors", back["small"].tolist(), tuple(back["big"].shape), str(back["big"].dtype),
          os.path.getsize("device.safetensors"), flush=True)
"""

USER_FILES = {"out/model.pt": b"TRAINED WEIGHTS", "train.log": b"epoch 0 done\n", "old.txt": b"old",
              "ren.txt": b"ren", "weights.safetensors": b"REAL SAFETENSORS"}


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    base = tmp_path_factory.mktemp("writes")
    user = base / "user"
    for name, data in USER_FILES.items():
        (user / name).parent.mkdir(parents=True, exist_ok=True)
        (user / name).write_bytes(data)
    (base / "train.py").write_text(textwrap.dedent(SCRIPT))
    before = _digest(user)
    done = subprocess.run([sys.executable, "-m", "allocsim", "capture", "-o", str(base / "t.parquet"),
                           "--keep-writes", str(base / "kept"), "--", sys.executable, str(base / "train.py")],
                          cwd=user, capture_output=True, text=True, timeout=300)
    return before, _digest(user), done, base


def test_the_users_files_are_byte_identical(captured):
    before, after, done, _ = captured
    assert done.returncode == 0, done.stderr
    assert after == before


def test_the_script_reloads_its_own_checkpoint(captured):
    _, _, done, _ = captured
    assert "reloaded step 1" in done.stdout and "metrics 45" in done.stdout


def test_safetensors_writes_are_redirected_too(captured):
    pytest.importorskip("safetensors")
    _, _, done, base = captured
    assert "safetensors [0.0, 1.0, 2.0, 3.0]" in done.stdout
    assert (base / "kept" / "files" / str(base / "user" / "weights.safetensors").lstrip("/")).is_file()


def test_the_summary_says_what_went_where(captured):
    _, _, done, base = captured
    line = next(x for x in done.stdout.splitlines() if x.startswith("capture: the script's writes went"))
    assert f"kept in {base / 'kept'}" in line
    assert "out/model.pt (2 writes" in line and "train.log (2 writes" in line and "out/metrics.npy (1 write" in line
    assert "1 removal not made: old.txt" in line and "ren.txt -> renamed.txt" in line
    assert "1 folder made there: out/extra" in line        # what is inside it is there too
    kept = base / "kept" / "files" / str(base / "user" / "out" / "model.pt").lstrip("/")
    assert kept.read_bytes()[:2] == b"PK"          # the script's own zip checkpoint, kept where it was sent


def test_the_trace_notes_it(captured):
    from allocsim.trace import read_trace

    _, _, _, base = captured
    meta = read_trace(str(base / "t.parquet")).meta
    assert any(note.startswith("the script's writes went to a scratch folder") for note in meta.notes)
    assert meta.version_hints["script_writes"]["removed"] == [str(base / "user" / "old.txt")]


def test_device_tensors_save_with_safetensors_and_load_back(captured):
    """safetensors' writer reads each host copy's bytes; a capture's copy of a 1 MiB device tensor has none
    (the corpus's accelerate checkpointing stopped with "Bad address"): the file is written in safetensors'
    format, the small tensor with its values, and safetensors reads it back."""
    pytest.importorskip("safetensors")
    _before, _after, done, _ = captured
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("device safetensors"))
    header = len('{"__metadata__":{"format":"pt"},"big":{"dtype":"F32","shape":[262144],"data_offsets":[0,1048576]},'
                 '"small":{"dtype":"F32","shape":[4],"data_offsets":[1048576,1048592]}}')
    size = 8 + header + (-header % 8) + (1 << 20) + 16
    assert line == f"device safetensors [0.0, 1.0, 2.0, 3.0] (262144,) torch.float32 {size}"
