"""What a capture in torch 2.6's PyPI (CUDA) build needs that 2.13's CPU build does not show (torchtitan under 2.6).

Each is reproduced here on the installed torch by giving it what 2.6 has: a builtin without a
signature for ``torch.cuda._exchange_device``, a ``Library.impl`` without ``allow_override``,
``_get_managed_states(modules)`` of one argument, a Python wrapper subclass that passes
``device=inner.device``, and a tensor with a capture-held weak reference handed to ``swap_tensors``.
"""

from __future__ import annotations

import inspect
import os
import sys
import weakref

import pytest

if os.environ.get("CI"):
    import torch  # noqa: F401  (CI installs it: a missing torch must fail, not skip)
else:
    pytest.importorskip("torch")

import torch  # noqa: E402

from allocsim.torch_capture import accelerator, cudnn_rnn, datadep, devicemap, signatures  # noqa: E402
from allocsim.torch_capture.autocast import CudaAutocast  # noqa: E402
from allocsim.torch_capture.distributed import fsdp  # noqa: E402


def _builtin_without_signature():
    # a METH_O builtin of torch._C, as the CUDA build's _cuda_exchangeDevice is
    builtin = torch._C._accelerator_exchangeDevice
    assert signatures.signature_of(builtin) is None
    return builtin


def test_exchange_device_of_a_cuda_build_is_conformed(monkeypatch):
    monkeypatch.setattr(torch.cuda, "_exchange_device", _builtin_without_signature())
    table = accelerator.shims({(torch.cuda, "Stream"): object, (torch.cuda, "Event"): object})
    shim = table[(torch.cuda, "_exchange_device")]
    assert shim(0) == 0
    with pytest.raises(TypeError):
        shim(device=0)                 # METH_O: by position only
    with pytest.raises(TypeError):
        signatures.conform(_builtin_without_signature(), lambda device: 0)


def test_a_meta_kernel_torch_registered_from_python_is_overridden_without_allow_override(monkeypatch):
    impls: set[str] = {"aten/_cudnn_rnn/Meta"}
    seen = []

    def impl_26(self, op_name, fn, dispatch_key=""):       # torch 2.6's Library.impl: refuses a key in _impls
        key = f"{self.ns}/{op_name}/{dispatch_key}"
        if key in impls:
            raise RuntimeError("This is not allowed since there's already a kernel registered from python")
        impls.add(key)
        seen.append(key)

    monkeypatch.setattr(torch.library, "_impls", impls)
    monkeypatch.setattr(torch.library.Library, "impl", impl_26)
    library = type("L", (), {"ns": "aten", "impl": impl_26})()
    cudnn_rnn.override_meta(library, "_cudnn_rnn", lambda *a: None)
    assert seen == ["aten/_cudnn_rnn/Meta"]


def test_fsdp_managed_states_takes_the_arguments_torch_gives():
    calls = []
    tracker = type("T", (), {})()
    one = fsdp._get_managed_states(tracker, lambda modules: calls.append((modules,)) or ("p", "b"))
    assert one([]) == ("p", "b") and calls == [([],)]
    two = fsdp._get_managed_states(tracker, lambda modules, ignored: calls.append((modules, ignored)) or ("p", "b"))
    assert two([], None) == ("p", "b") and calls[-1] == ([], None)


class _Wrapper(torch.Tensor):
    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=torch.device("cuda", 0),
                                                   requires_grad=False)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError


def test_a_python_wrapper_subclass_of_a_device_tensor_is_made_on_meta(monkeypatch):
    make = devicemap._wrapper_on_meta(torch.Tensor._make_wrapper_subclass)
    monkeypatch.setattr(torch.Tensor, "_make_wrapper_subclass", staticmethod(make), raising=False)
    w = _Wrapper(torch.empty(4, device="meta"))
    assert torch._C._dispatch_keys(w).has(torch._C.DispatchKey.Meta)
    cpu = torch.Tensor._make_wrapper_subclass(_Wrapper, (2,), dtype=torch.float32, device="cpu")
    assert not torch._C._dispatch_keys(cpu).has(torch._C.DispatchKey.Meta)


def test_swap_tensors_lets_go_of_the_captures_weak_references():
    modes = type("M", (), {"values": datadep.Values(1 << 20)})()
    autocast = CudaAutocast(lambda t: False)
    swap = devicemap._swap_forgetting(torch.utils.swap_tensors, modes, autocast)
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.ones(3))
    modes.values.set(a, torch.zeros(3))
    assert weakref.getweakrefs(a)
    with pytest.raises(RuntimeError):
        torch.utils.swap_tensors(a, b)           # torch's own refuses
    swap(a, b)
    assert float(a.detach().sum()) == 3.0 and float(b.detach().sum()) == 0.0
    assert inspect.signature(signatures.conform(torch.utils.swap_tensors, swap)) == inspect.signature(
        torch.utils.swap_tensors)


def test_roles_hold_no_weak_reference_on_a_parameter():
    from allocsim.torch_capture.channel import NullChannel
    from allocsim.torch_capture.roles import Roles
    from allocsim.torch_capture.tracker import StorageTracker

    roles = Roles(StorageTracker(NullChannel(), {"name": "A100 80GB", "major": 8, "minor": 0}))
    with roles.installed():
        layer = torch.nn.Linear(2, 2)
    assert not weakref.getweakrefs(layer.weight)        # nn.Module._apply may swap it (swap_tensors)


class _Torch26Scalars(torch.utils._python_dispatch.TorchDispatchMode):
    """torch 2.6's conversion of a mode's ``_local_scalar_dense`` answer: a ``uint64`` as an ``int64``."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._local_scalar_dense.default and isinstance(out, int) and out >= 2**63:
            raise RuntimeError("value cannot be converted to type int64_t without overflow")
        return out


@pytest.mark.skipif(not hasattr(torch, "uint64"), reason="torch without uint64")
def test_a_uint64_read_back_above_int64_passes_a_mode_as_torch_26_converts_it():
    # torchtitan's set_determinism: torch.get_rng_state()[:8].to(device) ... .view(torch.uint64).item()
    big = torch.tensor([2**63 + 5, 7], dtype=torch.uint64)
    with _Torch26Scalars():
        with pytest.raises(RuntimeError, match="int64_t"):
            big[0].item()                                   # what a capture under 2.6 raised
        assert devicemap._host_readback(torch.Tensor.item, big[0]) == 2**63 + 5
        assert devicemap._host_readback(torch.Tensor.__int__, big[0]) == 2**63 + 5
        assert devicemap._host_readback(torch.Tensor.__float__, big[0]) == float(2**63 + 5)
        assert devicemap._host_readback(torch.Tensor.tolist, big) == [2**63 + 5, 7]
        assert devicemap._host_readback(torch.Tensor.__bool__, big[1]) is True
        values = datadep.Values(1 << 20)
        device = torch.empty(2, dtype=torch.uint64, device="meta")
        values.set(device, big)                             # a device tensor whose values the capture has
        assert devicemap._readback(torch.Tensor.tolist, device, (device,), {}, values) == [2**63 + 5, 7]
        assert devicemap._host_readback(torch.Tensor.item, torch.tensor(-3)) == -3


class _FailingDriver:
    """triton 3.2's ``LazyProxy(_create_driver)`` where no ``libcuda.so`` is: any attribute creates the driver."""

    def __getattr__(self, name):
        raise AssertionError("libcuda.so cannot found!")


def test_triton_32s_autotune_gets_its_benchmarker_without_a_cuda_driver(monkeypatch):
    import types

    from allocsim.torch_capture import triton_driver
    from allocsim.torch_capture.channel import NullChannel
    from allocsim.torch_capture.tracker import StorageTracker

    config = types.SimpleNamespace(active=_FailingDriver())
    module = types.ModuleType(triton_driver.MODULE)
    module.driver = config
    monkeypatch.setitem(sys.modules, triton_driver.MODULE, module)
    testing = types.ModuleType("triton.testing")
    testing.do_bench = lambda *a, **k: 0.0
    monkeypatch.setitem(sys.modules, "triton.testing", testing)
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    sys.modules["triton"].testing = testing
    real = config.active
    tracker = StorageTracker(NullChannel(), {"name": "H100 80GB", "major": 9, "minor": 0})
    with devicemap.cuda_on_meta(tracker, {"name": "H100 80GB", "major": 9, "minor": 0}):
        # Autotuner.__init__ of triton 3.2: self.do_bench = driver.active.get_benchmarker()
        assert config.active.get_benchmarker() is testing.do_bench
        with pytest.raises(AssertionError, match="libcuda"):
            config.active.get_current_device()          # the rest is triton's own driver's
    assert config.active is real
    with pytest.raises(AssertionError):
        config.active.get_benchmarker()


def test_torch_26s_batch_isend_irecv_coalesces_on_the_captures_group():
    # torch 2.6: `if device.type == "cuda": with _coalescing_manager(group, device, async_ops=True)` on any group
    import torch.distributed as dist

    from allocsim.torch_capture.distributed.process_group import AnsweringGroup

    group = AnsweringGroup(0, 2)
    with dist.distributed_c10d._coalescing_manager(group, torch.device("cuda", 0), async_ops=True) as cm:
        group.send([torch.empty(4, device="meta")], 1).wait()
    assert len(cm.works) == 1
    cm.wait()
