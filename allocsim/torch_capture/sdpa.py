"""``F.scaled_dot_product_attention`` takes the kernel CUDA would pick for the capture's GPU and torch version: ``attention(...)``.

On a GPU, ``scaled_dot_product_attention`` (``aten/src/ATen/native/transformers/attention.cpp``)
asks ``select_sdp_backend`` (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, with the
shared checks of ``sdp_utils_cpp.h``) for a backend, converts a boolean mask to an additive one,
and runs that backend's kernel. On ``meta`` it would always run the generic math composite, whose
memory differs (an L x S score matrix per head, float32 copies of half-precision inputs): HF models
pass a mask, and the capture predicted GPT-2 under ``Trainer`` at twice its memory. Here the same
choice is made in Python from the same facts: the GPU's compute capability, the tensors' dtypes,
shapes, strides and storage offsets, the mask, dropout, ``enable_gqa``, grad mode, the backends the
script enabled (``torch.backends.cuda.enable_flash_sdp(False)``, ``sdpa_kernel([...])``, their
priority order) and the cuDNN version of the torch build.

``rules_for(torch_version)`` holds what differs between versions (see docs/capture.md for the
table and its sources); the checks below follow torch 2.13 as read (``sdp_utils.cpp`` as stored at
pytorch/pytorch 001f694a, whose shared checks match the installed 2.13 ``sdp_utils_cpp.h``, and
``attention.cpp``'s ``scaled_dot_product_attention``; the mask alignment of 8 is confirmed by the
installed 2.13 ``torch/_inductor/lowering.py``).

What each backend allocates, as ``attention.cpp`` does it on CUDA:

* flash: ``pad_last_dim<8>`` copies of q, k, v when the head size is not a multiple of 8, then
  ``_scaled_dot_product_flash_attention`` (output, float32 log-sum-exp);
* memory-efficient: a boolean mask becomes ``where(!mask, -inf, 0)`` in the query's dtype (the
  inverted mask is a temporary), ``preprocess_mask`` pads a mask whose strides are not multiples of 8
  (``pad_bias``: a copy whose last dimension is rounded up to 8, then sliced), then
  ``_scaled_dot_product_efficient_attention`` (output, log-sum-exp rounded up to 32 rows when
  gradients are needed); the converted mask is saved for backward;
* cuDNN: a boolean mask becomes ``where(!mask, -65504, 0)``, then
  ``_scaled_dot_product_cudnn_attention`` (output in the query's layout, float32 statistics);
* math: the generic composite, as on meta.

Not modelled: cuDNN's own workspace (cudnn-frontend sizes it per graph), nested tensors (left to
torch), the FA3 kernels (off unless ``torch.backends.cuda.enable_fa3_sdp``), ROCm.
"""

from __future__ import annotations

import os

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from . import torch_versions

FLASH, EFFICIENT, MATH, CUDNN = "flash_attention", "efficient_attention", "math", "cudnn_attention"
#: torch's SDPBackend numbers (``torch._C._get_sdp_priority_order()``) by name.
_BACKEND_NUMBERS = {0: MATH, 1: FLASH, 2: EFFICIENT, 3: CUDNN}
#: at::Context's default order (flash, efficient, math, cuDNN; overrideable last).
DEFAULT_ORDER = (FLASH, EFFICIENT, MATH, CUDNN)
_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


class Rules(NamedTuple):
    """What one torch version's SDPA dispatch needs beyond the checks all of 2.4-2.15 share."""

    version: tuple[int, int]
    cuda_major: int           # the CUDA of the build (a CPU build: of the release's PyPI wheel)
    cudnn_version: int        # cuDNN's runtime version number of that build (9.20.0 -> 92000)
    cudnn_first: str          # when cuDNN attention goes first: "never", "sm90" (9.0 only), "sm90_sm100_gated"
    flash_max_sm: tuple[int, int]
    cudnn_max_sm: tuple[int, int]


def _rules(version: tuple[int, int], cudnn_first: str, flash_max_sm: tuple[int, int],
           cudnn_max_sm: tuple[int, int]) -> Rules:
    wheel = torch_versions.wheel_for(version)
    return Rules(version, int(wheel.cuda.split(".")[0]), wheel.cudnn, cudnn_first, flash_max_sm, cudnn_max_sm)


#: Per torch version (the newest entry at or below the running version applies); CUDA and cuDNN are
#: the release's PyPI wheel's (``torch_versions.WHEELS``). 2.13 is the one read in full; the others
#: change only the fields whose history is cited in docs/capture.md.
RULES: dict[tuple[int, int], Rules] = {r.version: r for r in (
    _rules((2, 4), "never", (9, 0), (9, 0)),
    _rules((2, 5), "never", (9, 0), (9, 0)),          # 2.5.0 put cuDNN first on sm90; 2.5.1 undid it
    _rules((2, 6), "never", (9, 0), (9, 0)),
    _rules((2, 7), "never", (9, 0), (9, 0)),
    _rules((2, 8), "never", (9, 0), (9, 0)),
    _rules((2, 9), "sm90_sm100", (12, 1), (12, 1)),
    _rules((2, 10), "sm90_sm100_gated", (12, 1), (12, 1)),   # cuDNN 9.10 is below the gate: not first
    _rules((2, 11), "sm90_sm100_gated", (12, 1), (12, 1)),
    _rules((2, 12), "sm90_sm100_gated", (12, 1), (12, 1)),
    _rules((2, 13), "sm90_sm100_gated", (12, 1), (12, 1)),
    _rules((2, 14), "sm90_sm100_gated", (12, 1), (12, 1)),
    _rules((2, 15), "sm90_sm100_gated", (12, 1), (12, 1)),
)}


def rules_for(version: tuple[int, int]) -> Rules:
    """The rules of the newest listed torch version at or below ``version`` (its PyPI wheel's CUDA and cuDNN)."""
    return torch_versions.keyed(RULES, version)


def installed_rules(version: tuple[int, int]) -> Rules:
    """``rules_for(version)`` with the installed CUDA build's own CUDA and cuDNN (a CPU build keeps the wheel's)."""
    rules = rules_for(version)
    if tuple(version) != torch_versions.installed():
        return rules
    return rules._replace(cuda_major=torch_versions.cuda_major(), cudnn_version=torch_versions.cudnn_version())


def _prefer_cudnn(rules: Rules, capability: tuple[int, int]) -> bool:
    """``check_prefer_cudnn_attention``: whether cuDNN goes first for this GPU.

    ``TORCH_CUDNN_SDPA_DEPRIORITIZED=1`` in the script's environment says it never does
    (``c10::utils::check_env(...) != true`` in sdp_utils.cpp; check_env reads "1" as true).
    """
    if os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED") == "1":
        return False
    major, minor = capability
    if rules.cudnn_first == "sm90":
        return capability == (9, 0)
    if rules.cudnn_first == "sm90_sm100":
        return major in (9, 10)
    if rules.cudnn_first == "sm90_sm100_gated":
        if rules.cudnn_version <= 91500 or major not in (9, 10):
            return False
        return rules.cuda_major >= 13 or minor in (0, 3)
    return False


class Params(NamedTuple):
    """``sdp_params`` plus what the checks read of the device and the script's settings."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None
    dropout: float
    is_causal: bool
    enable_gqa: bool
    capability: tuple[int, int]
    requires_grad: bool


def _sm_in(capability: tuple[int, int], low: tuple[int, int], high: tuple[int, int]) -> bool:
    return low <= capability <= high


def _shapes_4d(p: Params) -> bool:
    return p.query.dim() == p.key.dim() == p.value.dim() == 4


def _dense_batch_heads(p: Params, supports_gqa: bool, same_heads: bool) -> bool:
    """``check_batch_size_and_num_heads_dense``."""
    q, k, v = p.query, p.key, p.value
    if not q.size(0) == k.size(0) == v.size(0):
        return False
    qh, kh, vh = q.size(-3), k.size(-3), v.size(-3)
    if p.enable_gqa and supports_gqa:
        if same_heads and kh != vh:
            return False
        return qh % kh == 0 and (same_heads or qh % vh == 0)
    return qh == kh == vh


def _nonzero_seq(p: Params) -> bool:
    return p.query.size(-2) != 0 and p.key.size(-2) != 0


def _last_stride_1(p: Params, ignore_singleton: bool) -> bool:
    ok = all(t.stride(-1) == 1 for t in (p.query, p.key, p.value))
    if ignore_singleton:
        ok = ok or p.query.size(-1) == 1
    mask_ok = p.attn_mask is None or p.attn_mask.stride(-1) == 1
    return ok and mask_ok


def _mask_shape_ok(p: Params) -> bool:
    """``check_attn_mask_shape`` (cuDNN): 2-D, or 4-D broadcastable over batch and heads; not requiring grad."""
    mask = p.attn_mask
    if mask is None:
        return True
    if mask.requires_grad:
        return False

    def compatible(size: int, target: int) -> bool:
        return size == target or size == 1
    if not (compatible(mask.size(-2), p.query.size(2)) and compatible(mask.size(-1), p.key.size(2))):
        return False
    if mask.dim() == 2:
        return True
    return mask.dim() == 4 and compatible(mask.size(0), p.query.size(0)) and compatible(mask.size(1), p.query.size(1))


def _dtype_in(p: Params, allowed: tuple[torch.dtype, ...]) -> bool:
    return p.query.dtype == p.key.dtype == p.value.dtype and p.query.dtype in allowed


def _low_precision(p: Params) -> tuple[torch.dtype, ...]:
    return (torch.float16, torch.bfloat16) if p.capability >= (8, 0) else (torch.float16,)


def can_use_flash(p: Params, rules: Rules) -> bool:
    """``can_use_flash_attention`` for dense inputs."""
    q, k, v = p.query, p.key, p.value
    if not torch.backends.cuda.flash_sdp_enabled() or not _shapes_4d(p) or p.attn_mask is not None:
        return False
    if not (q.size(-1) == k.size(-1) == v.size(-1) and q.size(-1) <= 256):
        return False
    if not _sm_in(p.capability, (8, 0), rules.flash_max_sm):
        return False
    if p.requires_grad and (_sm_in(p.capability, (8, 6), (8, 9)) or _sm_in(p.capability, (12, 0), (12, 1))):
        head = q.size(-1)
        if not (head <= 192 or (p.dropout == 0 and head > 224)):
            return False
    if p.is_causal and q.size(-2) != k.size(-2):
        return False
    if not _dtype_in(p, _low_precision(p)):
        return False
    return _dense_batch_heads(p, True, True) and _nonzero_seq(p) and _last_stride_1(p, True)


def _gemm_alignment(p: Params) -> int:
    """``minimum_gemm_alignment``: elements the head size must be a multiple of for memory-efficient attention."""
    half = p.query.dtype in (torch.float16, torch.bfloat16)
    use_tensor_cores = p.capability >= (8, 0) or (p.capability >= (7, 0) and half)
    alignment = 4 if p.capability >= (8, 0) else 1
    if use_tensor_cores:
        alignment = max(alignment, 128 // (16 if half else 32))
    return alignment


def can_use_efficient(p: Params) -> bool:
    """``can_use_mem_efficient_attention`` for dense inputs (CUDA, not ROCm)."""
    q, k, v = p.query, p.key, p.value
    if not torch.backends.cuda.mem_efficient_sdp_enabled() or not _sm_in(p.capability, (5, 0), (12, 1)):
        return False
    if not _shapes_4d(p):
        return False
    alignment = _gemm_alignment(p)
    if not (q.size(-1) == k.size(-1) and q.size(-1) % alignment == 0 and q.size(-1) > 0
            and v.size(-1) % alignment == 0 and v.size(-1) > 0):
        return False
    if p.capability >= (8, 0):
        alignment_bytes = alignment * q.element_size()
        for t in (q, k, v):
            if t.numel() and (t.storage_offset() * t.element_size()) % alignment_bytes:
                return False
    if not (_nonzero_seq(p) and _last_stride_1(p, False) and _dense_batch_heads(p, True, True)):
        return False
    allowed = (torch.float16, torch.float32, torch.bfloat16) if p.capability >= (8, 0) else (torch.float16, torch.float32)
    return _dtype_in(p, allowed)


def can_use_cudnn(p: Params, rules: Rules) -> bool:
    """``can_use_cudnn_attention`` for dense inputs."""
    q, k, v = p.query, p.key, p.value
    version = rules.cudnn_version
    if p.dropout > 0 and 91100 < version < 91400:
        return False
    if p.attn_mask is not None and not _takes(torch.ops.aten._scaled_dot_product_cudnn_attention.default,
                                              "attn_bias"):
        return False              # torch 2.4: check_for_attn_mask (no mask support yet)
    if not torch.backends.cuda.cudnn_sdp_enabled() or not _shapes_4d(p):
        return False
    if torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled():
        return False
    if not _dtype_in(p, _low_precision(p)) or not _mask_shape_ok(p):
        return False
    if not _sm_in(p.capability, (8, 0), rules.cudnn_max_sm) or p.dropout * 16 != math.floor(p.dropout * 16):
        return False
    if not (_nonzero_seq(p) and _last_stride_1(p, True) and _dense_batch_heads(p, True, False)):
        return False
    if q.size(0) > 65535 or q.size(1) > 65535 or version < 8903 or (version < 8906 and p.dropout != 0):
        return False
    d_qk, d_v = q.size(3), v.size(3)
    hopper_or_blackwell = p.capability == (9, 0) or p.capability[0] == 10
    limit = 192 if (hopper_or_blackwell and version >= 91100 and d_qk == 192 and d_v == 128) else 128
    if d_qk > limit or d_v > limit or d_qk % 8 or d_v % 8:
        return False
    s_q, s_k = q.size(2), k.size(2)
    if version < 8906 and s_k % 64:
        return False
    if version < 90000 and (s_q < 64 or (p.dropout != 0 and (s_q % 64 or s_k % 64))):
        return False
    return s_k != 1 and not (p.dropout != 0 and s_q == 1)


def priority_order(rules: Rules, capability: tuple[int, int]) -> tuple[str, ...]:
    """The backends in the order CUDA tries them: the script's order if it set one, else the default (cuDNN first where preferred)."""
    try:
        order = tuple(_BACKEND_NUMBERS[int(n)] for n in torch._C._get_sdp_priority_order() if int(n) in _BACKEND_NUMBERS)
    except (AttributeError, RuntimeError):
        order = DEFAULT_ORDER
    if order == DEFAULT_ORDER and _prefer_cudnn(rules, capability):
        return (CUDNN, FLASH, EFFICIENT, MATH)
    return order


def select_backend(p: Params, rules: Rules) -> str:
    """``select_sdp_backend``: the first usable backend in priority order, or the RuntimeError CUDA raises."""
    for backend in priority_order(rules, p.capability):
        if backend == CUDNN and can_use_cudnn(p, rules):
            return CUDNN
        if backend == FLASH and can_use_flash(p, rules):
            return FLASH
        if backend == EFFICIENT and can_use_efficient(p):
            return EFFICIENT
        if backend == MATH and torch.backends.cuda.math_sdp_enabled():
            return MATH
    raise RuntimeError("No available kernel. Aborting execution.")


def _convert_mask(mask: torch.Tensor | None, dtype: torch.dtype, *, cudnn: bool) -> torch.Tensor | None:
    """``convert_boolean_attn_mask`` (``-inf``) / ``convert_boolean_attn_mask_cudnn`` (``-65504``); float masks pass."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    if cudnn:     # its zero is a CPU scalar: no device request for it
        return torch.where(mask.logical_not(), -65504.0, torch.scalar_tensor(0.0, dtype=dtype))
    zero = torch.scalar_tensor(0.0, dtype=dtype, device=mask.device)
    return torch.where(mask.logical_not(), -math.inf, zero)


def _preprocess_mask(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``preprocess_mask``: pad to an aligned copy when any stride (but the last, which must be 1) is not a multiple of 8."""
    aligned = all(mask.stride(i) % 8 == 0 for i in range(mask.dim() - 1)) and mask.stride(-1) == 1
    if not aligned:
        last = mask.size(-1)
        mask = F.pad(mask, (0, 8 - last % 8))[..., :last]
    return mask.expand(q.size(0), q.size(1), q.size(2), k.size(2))


def _pad_last_dim(t: torch.Tensor) -> torch.Tensor:
    last = t.size(-1)
    return t if last % 8 == 0 else F.pad(t, (0, 8 - last % 8))


def run(backend: str, p: Params, scale: float | None) -> torch.Tensor:
    """The output of ``backend`` with the allocations ``attention.cpp`` makes around its kernel."""
    aten = torch.ops.aten
    q, k, v = p.query, p.key, p.value
    if backend == CUDNN:
        if not _takes(aten._scaled_dot_product_cudnn_attention.default, "attn_bias"):
            # torch 2.4's cuDNN kernel takes no mask (can_use_cudnn refused one)
            return aten._scaled_dot_product_cudnn_attention(q, k, v, p.dropout, p.is_causal, False, scale=scale)[0]
        mask = _convert_mask(p.attn_mask, q.dtype, cudnn=True)
        return aten._scaled_dot_product_cudnn_attention(q, k, v, mask, p.requires_grad, p.dropout, p.is_causal,
                                                        False, scale=scale)[0]
    if backend == FLASH:
        head = q.size(-1)
        og_scale = scale if scale is not None else 1.0 / math.sqrt(head)
        out = aten._scaled_dot_product_flash_attention(_pad_last_dim(q), _pad_last_dim(k), _pad_last_dim(v),
                                                       p.dropout, p.is_causal, False, scale=og_scale)[0]
        return out if out.size(-1) == head else out[..., :head]
    mask = _convert_mask(p.attn_mask, q.dtype, cudnn=False)
    if backend == EFFICIENT:
        if mask is not None:
            mask = _preprocess_mask(mask, q, k)
        return aten._scaled_dot_product_efficient_attention(q, k, v, mask, p.requires_grad, p.dropout, p.is_causal,
                                                            scale=scale)[0]
    if not _takes(aten._scaled_dot_product_attention_math.default, "enable_gqa"):    # before 2.5
        return aten._scaled_dot_product_attention_math(q, k, v, mask, p.dropout, p.is_causal, None, scale=scale)[0]
    return aten._scaled_dot_product_attention_math(q, k, v, mask, p.dropout, p.is_causal, None, scale=scale,
                                                   enable_gqa=p.enable_gqa)[0]


def _takes(overload: Any, name: str) -> bool:
    """Whether this torch's ``overload`` has an argument ``name`` (schemas grew between releases)."""
    return any(a.name == name for a in overload._schema.arguments)


def bind(args: tuple, kwargs: dict) -> dict[str, Any]:
    """``scaled_dot_product_attention``'s arguments by name."""
    return dict(zip(_NAMES, args)) | kwargs


def attention(args: tuple, kwargs: dict, is_device: Any, capability: tuple[int, int],
              version: tuple[int, int]) -> tuple[torch.Tensor, str] | None:
    """``(output, backend)`` of a device ``scaled_dot_product_attention`` as CUDA runs it; None to leave the call to torch."""
    given = bind(args, kwargs)
    q, k, v = given.get("query"), given.get("key"), given.get("value")
    mask = given.get("attn_mask")
    if not all(isinstance(t, torch.Tensor) and is_device(t) for t in (q, k, v)):
        return None
    if any(t.is_nested for t in (q, k, v)) or (mask is not None and not isinstance(mask, torch.Tensor)):
        return None
    if torch.is_autocast_enabled("cuda"):
        # autocast (lower_precision_fp) casts SDPA's floating inputs before the kernel is chosen
        low = torch.get_autocast_dtype("cuda")
        q, k, v = (t.to(low) if t.dtype == torch.float32 else t for t in (q, k, v))
        if mask is not None and mask.dtype == torch.float32:
            mask = mask.to(low)
    if not q.dtype == k.dtype == v.dtype:
        raise RuntimeError("Expected query, key, and value to have the same dtype, but got query.dtype: "
                           f"{q.dtype} key.dtype: {k.dtype} and value.dtype: {v.dtype} instead.")
    if mask is not None and mask.dtype not in (torch.bool, torch.float32, q.dtype):
        raise RuntimeError("Expected attn_mask dtype to be bool or float or to match query dtype, but got "
                           f"attn_mask.dtype: {mask.dtype} and  query.dtype: {q.dtype} instead.")
    requires_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    p = Params(q, k, v, mask, float(given.get("dropout_p", 0.0)), bool(given.get("is_causal", False)),
               bool(given.get("enable_gqa", False)), tuple(capability), requires_grad)
    rules = installed_rules(version)
    backend = select_backend(p, rules)
    return run(backend, p, given.get("scale")), backend
