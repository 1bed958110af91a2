"""``torch.autocast("cuda")`` on the capture's meta tensors, as CUDA's autocast would cast them: ``install(tracker)``.

PyTorch's CUDA autocast casts only tensors that are on a CUDA device, so under the capture (where
``cuda`` is the ``meta`` device) ``torch.autocast("cuda", dtype=torch.bfloat16)`` would change
nothing and the trace would be the float32 run. Here the same rules run as Python kernels on a
dispatch key no backend uses (``AutocastPrivateUse1``), above autograd exactly where CUDA's autocast
sits, so casts are recorded in the graph and their outputs saved for backward as on the GPU:

* the op lists and their policies are read from the installed torch's own header
  (``torch/include/ATen/autocast_mode.h``: ``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``,
  ``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE``,
  ``AT_FORALL_PROMOTE``), plus the CUDA-only registrations of ``aten/src/ATen/autocast_mode.cpp``
  (``cudnn_convolution``, ``cudnn_convolution_transpose``; ``binary_cross_entropy`` refused); a torch
  without the header falls back to the lists of torch 2.13;
* ``cached_cast`` as in ``autocast_mode.cpp``: a float32 leaf that requires grad, is not a view, and
  is cast to the autocast dtype while the cache is enabled (and not in inference mode) is cast once
  and kept until the outermost autocast block exits (the weight cache: bf16 copies of every weight
  a forward touched stay alive to its end); every other eligible tensor is cast at each use;
* eligible tensors are the device (``cuda``) tensors of floating type other than float64; host
  tensors are never cast, as CPU tensors under CUDA autocast.

Whether autocast is on, its dtype and whether the cache is enabled are torch's own thread-local
state (``torch.is_autocast_enabled("cuda")`` ...), set by the script's ``torch.autocast`` blocks.
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from typing import Any, Callable

import torch
from torch._C import DispatchKey, DispatchKeySet

from . import torch_versions

_KEY = DispatchKey.AutocastPrivateUse1
_KEY_NAME = "AutocastPrivateUse1"
_KEYSET = DispatchKeySet(_KEY)
LOWER, FP32, FP32_SET_OPT_DTYPE, FP32_APPEND_DTYPE, PROMOTE, BANNED = (
    "lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype", "promote", "banned")
_MACROS = {"AT_FORALL_LOWER_PRECISION_FP": LOWER, "AT_FORALL_FP32": FP32,
           "AT_FORALL_FP32_SET_OPT_DTYPE": FP32_SET_OPT_DTYPE, "AT_FORALL_PROMOTE": PROMOTE}
#: Registered for CUDA in autocast_mode.cpp beside the header's lists.
_CUDA_EXTRA = {"cudnn_convolution": LOWER, "cudnn_convolution_transpose": LOWER, "binary_cross_entropy": BANNED}
_BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast.")
#: torch 2.13.0's lists (``autocast_mode.h``), for a torch installed without its headers.
_FALLBACK = {
    LOWER: "_convolution.deprecated _convolution conv1d conv2d conv3d conv_tbc conv_transpose1d "
           "conv_transpose2d.input conv_transpose3d.input convolution prelu addmm addmv addr matmul einsum mm mv "
           "linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot _thnn_fused_lstm_cell "
           "_thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell "
           "_scaled_dot_product_flash_attention scaled_dot_product_attention",
    FP32: "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow.Tensor_Scalar "
          "pow.Tensor_Tensor pow.Scalar softplus layer_norm native_layer_norm rms_norm group_norm "
          "frobenius_norm.dim nuclear_norm nuclear_norm.dim cosine_similarity poisson_nll_loss "
          "cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss smooth_l1_loss "
          "huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss triplet_margin_loss "
          "multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp "
          "upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d _upsample_nearest_exact2d "
          "upsample_nearest3d _upsample_nearest_exact3d upsample_linear1d upsample_bilinear2d "
          "_upsample_bilinear2d_aa upsample_trilinear3d upsample_bicubic2d _upsample_bicubic2d_aa",
    FP32_SET_OPT_DTYPE: "prod prod.dim_int softmax.int log_softmax.int cumprod cumsum linalg_vector_norm "
                        "linalg_matrix_norm linalg_matrix_norm.str_ord sum sum.dim_IntList",
    FP32_APPEND_DTYPE: "norm.Scalar norm.ScalarOpt_dim",
    PROMOTE: "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add",
}


def header_path() -> str:
    """Where the installed torch keeps ``ATen/autocast_mode.h``."""
    return os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "autocast_mode.h")


def _macro_body(text: str, macro: str) -> str | None:
    start = text.find(f"#define {macro}(_)")
    if start < 0:
        return None
    end = text.find("\n\n", start)
    return text[start:end if end > 0 else len(text)].replace("\\\n", " ")


def parse_header(text: str) -> dict[str, str]:
    """``{"mm": "lower_precision_fp", "conv_transpose2d.input": ..., "norm.Scalar": "fp32_append_dtype"}``."""
    policies: dict[str, str] = {}
    for macro, policy in _MACROS.items():
        body = _macro_body(text, macro)
        if body is None:
            continue
        for match in re.finditer(r"\b_\(\s*(\w+)\s*(?:,\s*(\w+)\s*)?\)", body):
            name, overload = match.group(1), match.group(2)
            if name == "_":
                continue
            policies[f"{name}.{overload}" if overload else name] = policy
    body = _macro_body(text, "AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE")
    if body is not None:
        for match in re.finditer(r'"(\w+\.\w+)"', body):
            policies[match.group(1)] = FP32_APPEND_DTYPE
    return policies


def cuda_policies() -> tuple[dict[str, str], str]:
    """The CUDA autocast policy of every op, and where it was read from (the header, or torch 2.13's lists)."""
    try:
        with open(header_path(), encoding="utf-8") as handle:
            policies = parse_header(handle.read())
        source = "the installed torch's ATen/autocast_mode.h"
    except OSError:
        policies = {}
    if not policies:
        policies = {name: policy for policy, names in _FALLBACK.items() for name in names.split()}
        source = "torch 2.13.0's autocast lists (the installed torch has no ATen/autocast_mode.h)"
    policies.update(_CUDA_EXTRA)
    return policies, source


def _overload(name: str) -> Any:
    op_name, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, op_name, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def _tensor_kind(arg_type: str) -> str | None:
    if arg_type == "Tensor":
        return "tensor"
    if arg_type == "Optional[Tensor]":
        return "optional"
    if arg_type == "List[Tensor]":
        return "list"
    return None


class CudaAutocast:
    """The Python kernels and the weight cache; ``install()`` registers them, ``enable_thread()`` per thread."""

    def __init__(self, is_device: Callable[[torch.Tensor], bool]):
        self.is_device = is_device
        self.policies, self.source = cuda_policies()
        self.missing: list[str] = []
        self._cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        self._cache_lock = threading.Lock()
        self._library: Any = None
        self._fallback_library: Any = None
        self.n_casts = 0
        self.n_cached = 0

    # ----------------------------------------------------------------- registration
    def install(self) -> None:
        """Register the kernels (process-wide; only the threads that ``enable_thread`` reach them)."""
        self._fallback_library = torch.library.Library("_", "IMPL")
        torch_versions.register_fallthrough(self._fallback_library, _KEY_NAME)
        self._library = torch.library.Library("aten", "IMPL")
        for name, policy in sorted(self.policies.items()):
            overload = _overload(name)
            if overload is None:
                self.missing.append(name)
                continue
            self._library.impl(name, self._kernel(overload, policy), _KEY_NAME)

    @staticmethod
    def enable_thread() -> None:
        """Let the calling thread's operators reach the kernels (torch's TLS excludes autocast keys by default)."""
        torch._C._dispatch_tls_set_dispatch_key_excluded(_KEY, False)
        torch._C._dispatch_tls_set_dispatch_key_included(_KEY, True)

    def clear_cache(self) -> None:
        """The outermost ``torch.autocast`` block exited: the weight cache's copies go."""
        with self._cache_lock:
            self._cache.clear()

    # ----------------------------------------------------------------- casting
    def _eligible(self, t: Any) -> bool:
        return (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
                and self.is_device(t))

    def cached_cast(self, to_dtype: torch.dtype, value: Any, lower_dtype: torch.dtype) -> Any:
        """``value`` cast as ``at::autocast::cached_cast`` would (tensors, lists of tensors, anything else as is)."""
        if isinstance(value, (list, tuple)):
            return type(value)(self.cached_cast(to_dtype, v, lower_dtype) for v in value)
        if not self._eligible(value) or value.dtype == to_dtype:
            return value
        can_cache = (to_dtype == lower_dtype and value.dtype == torch.float32 and value.requires_grad
                     and value.is_leaf and not value._is_view() and torch.is_autocast_cache_enabled()
                     and not torch.is_inference_mode_enabled())
        if not can_cache:
            self.n_casts += 1
            return torch.ops.aten._to_copy.default(value, dtype=to_dtype)
        key = id(value)
        with self._cache_lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0]() is value:
                return hit[1]
        with torch.enable_grad():          # the cached copy keeps its graph for later grad-enabled uses
            cast = torch.ops.aten._to_copy.default(value, dtype=to_dtype)
        with self._cache_lock:
            self._cache[key] = (weakref.ref(value), cast)
        self.n_casts += 1
        self.n_cached += 1
        return cast

    def _promote_dtype(self, values: list[Any], lower_dtype: torch.dtype) -> torch.dtype:
        current = lower_dtype
        for value in values:
            for t in (value if isinstance(value, (list, tuple)) else (value,)):
                if not self._eligible(t):
                    continue
                if current == torch.float32 or t.dtype == torch.float32:
                    current = torch.float32
                elif not (current == lower_dtype and t.dtype == lower_dtype):
                    raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
        return current

    def _kernel(self, overload: Any, policy: str) -> Callable[..., Any]:
        """The Python kernel of one op: its autocast policy, and the CUDA code path where meta's differs."""
        if overload in _HALF_TO_FLOAT:
            return self._softmax_kernel(overload, self._policy_kernel(overload, policy))
        return self._policy_kernel(overload, policy)

    def _softmax_kernel(self, overload: Any, inner: Callable[..., Any]) -> Callable[..., Any]:
        """``softmax(x_half, dim, dtype=float32)``: CUDA's fused half-to-float kernel, no float copy of the input.

        ``aten/src/ATen/native/SoftMax.cpp``: a CUDA float16 input asked for float32 output runs
        ``_softmax(input, dim, half_to_float=True)``; every other case (bfloat16 included, and
        every tensor on meta) converts the input first. Applied after autocast's own casting.
        """
        fused = _HALF_TO_FLOAT[overload]
        autocast = self

        def kernel(x: Any, dim: int, dtype: Any = None) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(_KEYSET):
                if torch.is_autocast_enabled("cuda") and dtype is None and autocast._eligible(x):
                    dtype = torch.float32          # fp32_set_opt_dtype
                if dtype == torch.float32 and isinstance(x, torch.Tensor) and x.dtype == torch.float16 \
                        and autocast.is_device(x):
                    return fused(x, dim, True)
            return inner(x, dim, dtype)

        return kernel

    def _policy_kernel(self, overload: Any, policy: str) -> Callable[..., Any]:
        arguments = overload._schema.arguments
        names = [a.name for a in arguments]
        kinds = [_tensor_kind(str(a.type)) for a in arguments]
        promotable = [k in ("tensor", "list") for k in kinds]
        redispatch = _append_dtype_target(overload) if policy == FP32_APPEND_DTYPE else None
        autocast = self

        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(_KEYSET):
                if not torch.is_autocast_enabled("cuda"):
                    return overload(*args, **kwargs)
                lower = torch.get_autocast_dtype("cuda")
                if policy == BANNED:
                    raise RuntimeError(_BANNED_MESSAGE)
                values = list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]
                bound = dict(zip(names, values))
                first = args[0] if args else bound.get(names[0])
                if policy == FP32_SET_OPT_DTYPE:
                    if autocast._eligible(first) and bound.get("dtype") is None and "dtype" in names:
                        kwargs = dict(kwargs)
                        index = names.index("dtype")
                        if index < len(args):
                            args = args[:index] + (torch.float32,) + args[index + 1:]
                        else:
                            kwargs["dtype"] = torch.float32
                    return overload(*args, **kwargs)
                if policy == FP32_APPEND_DTYPE:
                    out_dtype = torch.float32 if autocast._eligible(first) else first.dtype
                    return redispatch(*args, **kwargs, dtype=out_dtype)
                if policy == LOWER:
                    to_dtype = lower
                elif policy == FP32:
                    to_dtype = torch.float32
                else:
                    to_dtype = autocast._promote_dtype(
                        [v for v, ok in zip(values, promotable) if ok], lower)
                args = tuple(autocast.cached_cast(to_dtype, a, lower) if kinds[i] else a
                             for i, a in enumerate(args))
                kwargs = {k: (autocast.cached_cast(to_dtype, v, lower) if k in names and kinds[names.index(k)] else v)
                          for k, v in kwargs.items()}
                return overload(*args, **kwargs)

        return kernel


#: softmax and log_softmax with a dtype, and the kernels that take half and give float on CUDA.
_HALF_TO_FLOAT = {torch.ops.aten.softmax.int: torch.ops.aten._softmax.default,
                  torch.ops.aten.log_softmax.int: torch.ops.aten._log_softmax.default}


def _append_dtype_target(overload: Any) -> Any:
    """The overload of the same op taking the same arguments plus a trailing ``dtype`` (``norm.ScalarOpt_dtype``)."""
    want = [(a.name, str(a.type)) for a in overload._schema.arguments]
    packet = getattr(torch.ops.aten, overload._schema.name.split("::")[1])
    for name in packet.overloads():
        candidate = getattr(packet, name)
        args = [(a.name, str(a.type)) for a in candidate._schema.arguments]
        if len(args) == len(want) + 1 and args[-1][0] == "dtype" and \
                [n for n, _ in args[:-1]] == [n for n, _ in want]:
            return candidate
    raise RuntimeError(f"autocast: no dtype overload of {overload._schema.name} for the fp32_append_dtype policy")
