"""Every function ``allocsim capture`` stands in for takes exactly the installed torch's arguments (issue 39, F4).

timm's prefetcher calls ``torch.cuda.stream(stream=s)``; a stand-in with its own parameter names
refused it. Here every replacement the capture installs (``devicemap.shim_table``: ``torch.cuda``,
``torch.accelerator``, the legacy types, the optimizers' device lists, ``torch.load``,
``torch.compile``, ...) is compared with the function it replaces in this torch: parameter names,
kinds (positional-only, keyword-only, ...) and defaults. Classes are compared by their constructor.
A few originals are C builtins without a signature; they are listed, so a new one cannot slip by.
No capture runs: the table is built in this process and patched in only for the calls below.
"""

from __future__ import annotations

import contextlib
import inspect
import os

import pytest

if os.environ.get("CI"):
    import torch  # noqa: F401  (CI installs it: a missing torch must fail, not skip)
else:
    pytest.importorskip("torch")

import torch  # noqa: E402

from allocsim.torch_capture import devicemap, signatures  # noqa: E402
from allocsim.torch_capture.autocast import CudaAutocast  # noqa: E402
from allocsim.torch_capture.channel import NullChannel  # noqa: E402
from allocsim.torch_capture.tracker import StorageTracker  # noqa: E402

#: Originals whose signature Python cannot read (C builtins and C types): compared by hand in the
#: capture's own tests instead (tests/test_capture_paths.py, test_capture_device_identity.py).
NO_SIGNATURE = {"pin_memory", "is_pinned", "clear_autocast_cache", "has_torch_function", "record_stream",
                "_use_cudnn_rnn_flatten_weight", "resize_", "_get_accelerator",   # C builtins: no signature to read
                "_exchange_device", "_maybe_exchange_device",   # torch._C._cuda_exchangeDevice on CUDA builds
                "Stream", "Event"} | {f"{kind}Tensor" for kind in (
                    "Float", "Double", "Half", "BFloat16", "Byte", "Char", "Short", "Int", "Long", "Bool")}


@pytest.fixture(scope="module")
def table():
    tracker = StorageTracker(NullChannel(), {"name": "A100 80GB", "major": 8, "minor": 0})
    autocast = CudaAutocast(tracker.is_device)
    return devicemap.shim_table(tracker, {"name": "A100 80GB", "major": 8, "minor": 0}, autocast,
                                devicemap.ThreadModes(tracker, autocast))


def _params(signature: inspect.Signature) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def _replacement_signature(replacement) -> inspect.Signature:
    if isinstance(replacement, type):
        signature = inspect.signature(replacement.__init__, follow_wrapped=False)
        return signature.replace(parameters=list(signature.parameters.values())[1:])
    return inspect.signature(replacement, follow_wrapped=False)


def test_every_replacement_takes_torchs_arguments(table):
    compared, unreadable = [], set()
    for (owner, name), replacement in table.items():
        if isinstance(replacement, property) or not callable(replacement):
            continue                 # Tensor.is_cuda, torch.cuda.default_generators: attributes, not calls
        original = getattr(owner, name)
        expected = signatures.signature_of(original)
        if expected is None:
            unreadable.add(name)
            continue
        got = _replacement_signature(replacement)
        where = f"{getattr(owner, '__name__', owner)}.{name}"
        assert _params(got) == _params(expected), f"{where}: torch {expected}, capture {got}"
        compared.append(where)
    assert unreadable <= NO_SIGNATURE, unreadable - NO_SIGNATURE
    # the ones that broke real scripts, and the bulk of torch.cuda / torch.accelerator, are among them
    for where in ("torch.cuda.stream", "torch.cuda.synchronize", "torch.cuda.set_device",
                  "torch.cuda.memory._record_memory_history", "torch.accelerator.current_stream",
                  "torch.cuda.device", "torch.accelerator.device_index", "torch.load", "torch.compile"):
        assert where in compared, where
    assert len(compared) >= 90


@contextlib.contextmanager
def _installed(table):
    with contextlib.ExitStack() as stack:
        for (owner, name), replacement in table.items():
            if owner is torch.Tensor or name in ("__init__", "_bootstrap_inner", "has_torch_function"):
                continue                             # calls below need only the module functions
            stack.enter_context(devicemap._patched(owner, name, replacement))
        yield


def test_keywords_and_defaults_reach_the_capture_as_on_the_gpu(table):
    with _installed(table):
        s = torch.cuda.Stream(device=None, priority=-1)
        with torch.cuda.stream(stream=s):              # timm's PrefetchLoader
            assert torch.cuda.current_stream(device=0) is s
        assert torch.cuda.current_stream() is not s
        torch.cuda.synchronize(device=0)
        torch.cuda.set_device(device=0)
        torch.cuda.manual_seed_all(seed=1)
        assert torch.cuda.get_device_name(device=0) == "A100 80GB"
        assert torch.cuda.is_bf16_supported(including_emulation=False) is True
        assert torch.cuda.memory_allocated(device=0) == 0
        with torch.cuda.device(device=0):
            pass
        with torch.accelerator.device_index(0):
            assert torch.accelerator.memory_allocated(0) == 0
        torch.cuda.nvtx.range_push(msg="step")
        torch.cuda.nvtx.range_pop()
        torch.cuda.Event(enable_timing=True, external=False).record()


def test_a_wrong_call_raises_torchs_type_error(table):
    with _installed(table):
        with pytest.raises(TypeError):
            torch.cuda.stream(s=None)                    # the old stand-in's own name
        with pytest.raises(TypeError):
            torch.cuda.synchronize(0, 1)
        with pytest.raises(TypeError):
            torch.accelerator.memory_allocated(device_index=0)     # positional-only in torch
        with pytest.raises(TypeError):
            torch.cuda.manual_seed()                     # seed is required


def test_conform_binds_defaults_and_positions():
    def original(a, b=2, /, c=3, *, d=4):
        raise AssertionError("never called")
    seen = []
    shim = signatures.conform(original, lambda *args, **kwargs: seen.append((args, kwargs)))
    shim(1, c=5)
    assert seen == [((1, 2, 5), {"d": 4})]
    assert inspect.signature(shim) == inspect.signature(original)
    with pytest.raises(TypeError):
        shim(1, b=2)


def test_a_cuda_build_s_builtin_exchange_device_gets_a_stand_in(monkeypatch):
    # On CUDA builds torch.cuda._exchange_device is torch._C._cuda_exchangeDevice, a builtin with no
    # signature; building the table raised "has no signature to conform to" for every capture with a
    # CUDA-build interpreter (torch 2.14.1+cu130: milabench's resnet152-ddp-gpus script)
    builtin = torch._C._get_tracing_state
    assert signatures.signature_of(builtin) is None
    for name in ("_exchange_device", "_maybe_exchange_device"):
        monkeypatch.setattr(torch.cuda, name, builtin)
    tracker = StorageTracker(NullChannel(), {"name": "A100 80GB", "major": 8, "minor": 0})
    autocast = CudaAutocast(tracker.is_device)
    built = devicemap.shim_table(tracker, {"name": "A100 80GB", "major": 8, "minor": 0}, autocast,
                                 devicemap.ThreadModes(tracker, autocast))
    assert built[(torch.cuda, "_exchange_device")](3) == 0
    assert built[(torch.cuda, "_maybe_exchange_device")](device=1) == 0
