"""DeepSpeed under capture: its CUDA extensions answered as their kernels allocate, ``patches()`` on import.

DeepSpeed installed without its ops (``DS_BUILD_OPS=0``, the usual ``pip install deepspeed``)
compiles an op the first time it is loaded (``OpBuilder.load`` -> ``jit_load``), which needs
``nvcc`` and ``CUDA_HOME``: a CPU capture has neither. The ops a training run loads are optimizer
steps whose kernels work in place on the tensors the Python code made, so the device memory they
take is what that Python code allocates (recorded as usual), and the kernel itself asks for nothing:

* ``fused_adam`` (``FusedAdam``, DeepSpeed's default Adam/AdamW on CUDA): ``multi_tensor_adam``
  (csrc/adam/multi_tensor_adam.cu, ``multi_tensor_apply``) updates parameters, ``exp_avg`` and
  ``exp_avg_sq`` in place; its no-op flag is the ``IntTensor([0])`` ``FusedAdam.__init__`` makes.
  ``fused_lion`` (csrc/lion/multi_tensor_lion.cu) likewise.
* ``cpu_adam``, ``cpu_adagrad``, ``cpu_lion`` (ZeRO-Offload's optimizers, csrc/adam/cpu_adam.cpp):
  host memory only; the states live on the CPU (``DeepSpeedCPUAdam.step``: ``device='cpu'``).

``DeepSpeedCPUAdam.step`` checks that every parameter is on the CPU; a capture keeps large host
tensors abstract (on ``meta``, no memory), so the check would refuse them. Its step runs on the host
only (the states are ``device='cpu'``, the update is ``ds_opt_adam.adam_update`` on host memory), so
under capture it makes its states on the host as it does and updates nothing
(``cpu_adam_patches``); what the card holds around it (the bit16 copies ZeRO-Offload copies back)
is DeepSpeed's own code, recorded as usual.

So ``load()`` of these returns a stand-in whose functions change nothing and allocate nothing,
exactly what the kernels ask the caching allocator for. Any other op (quantizers, transformer
kernels, async I/O for NVMe offload) is loaded as DeepSpeed does, and fails as it fails without
a compiler: the capture says which op stopped it.

ZeRO-3 checks that every rank agrees with rank 0 (deepspeed/runtime/zero/utils.py
``assert_ints_same_as_other_ranks``: a broadcast from rank 0 read back on the host). A capture's
broadcast keeps this rank's tensor, which on a rank other than 0 is its placeholder, so the check
would fail where the real job agrees; here the check runs as written (its small device tensors are
recorded) and rank 0's answer is taken to be this rank's own, as DDP's parameter check passes.

DeepSpeed's accelerator is CUDA under capture: ``get_accelerator()`` picks it when
``torch.cuda.device_count() > 0 and torch.cuda.is_available()`` (accelerator/real_accelerator.py),
which the capture answers as one GPU.
"""

from __future__ import annotations

import types
from typing import Any

#: Ops whose kernels work in place (or on the host): their stand-ins allocate nothing, as they do.
IN_PLACE_OPS = {
    "fused_adam": ("multi_tensor_adam",),
    "fused_lion": ("multi_tensor_lion",),
    "cpu_adam": ("create_adam", "adam_update", "destroy_adam", "adam_rollback"),
    "cpu_adagrad": ("create_adagrad", "adagrad_update", "destroy_adagrad"),
    "cpu_lion": ("create_lion", "lion_update", "destroy_lion"),
}


def _nothing(*args: Any, **kwargs: Any) -> int:
    return 0


def stand_in(name: str) -> types.ModuleType:
    """The module ``OpBuilder.load()`` returns for op ``name`` under capture (its kernels allocate nothing)."""
    module = types.ModuleType(f"allocsim_capture_{name}_op",
                              f"allocsim capture's stand-in for DeepSpeed's {name} (in place: no allocation)")
    for function in IN_PLACE_OPS[name]:
        setattr(module, function, _nothing)
    return module


def patches() -> list[tuple[Any, str, Any]]:
    """``OpBuilder.load`` answering the in-place ops without building them."""
    from deepspeed.ops.op_builder import builder  # noqa: PLC0415

    original = builder.OpBuilder.load
    loaded: dict[str, types.ModuleType] = {}

    def load(self: Any, verbose: bool = False) -> Any:
        name = getattr(self, "name", "")
        if name in IN_PLACE_OPS:
            if name not in loaded:
                loaded[name] = stand_in(name)
            return loaded[name]
        return original(self, verbose)

    return [(builder.OpBuilder, "load", load)]


def zero_utils_patches() -> list[tuple[Any, str, Any]]:
    """ZeRO's agreement checks answered as a job of equal ranks answers them (module doc)."""
    from deepspeed.runtime.zero import utils  # noqa: PLC0415

    length_check = utils.assert_lst_len_same_as_other_ranks
    from_rank0 = utils.get_lst_from_rank0

    def assert_lst_len_same_as_other_ranks(lst: Any) -> None:
        try:
            length_check(lst)
        except RuntimeError as exc:
            if "disagreement" not in str(exc):
                raise

    def get_lst_from_rank0(lst: Any) -> Any:
        from_rank0(lst)                      # its device tensor and broadcast, as the GPU run makes them
        return list(lst)

    return [(utils, "assert_lst_len_same_as_other_ranks", assert_lst_len_same_as_other_ranks),
            (utils, "get_lst_from_rank0", get_lst_from_rank0)]


def cpu_adam_patches() -> list[tuple[Any, str, Any]]:
    """``DeepSpeedCPUAdam.step`` on the host without the device check (module doc); states as deepspeed/ops/adam/cpu_adam.py makes them."""
    import torch  # noqa: PLC0415
    from deepspeed.ops.adam import cpu_adam  # noqa: PLC0415

    def step(self: Any, closure: Any = None, fp16_param_groups: Any = None) -> Any:
        loss = closure() if closure is not None else None
        state_dtype = torch.float if getattr(self, "fp32_optimizer_states", True) else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p.data, dtype=state_dtype or p.dtype, device="cpu")
                    state["exp_avg_sq"] = torch.zeros_like(p.data, dtype=state_dtype or p.dtype, device="cpu")
                state["step"] += 1
        return loss

    return [(cpu_adam.DeepSpeedCPUAdam, "step", step)]
