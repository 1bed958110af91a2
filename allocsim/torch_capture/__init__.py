"""Predict a PyTorch script's CUDA allocations on a machine without a GPU: ``allocsim capture -- python train.py``.

The script runs unchanged. ``cuda`` is mapped to PyTorch's ``meta`` device (shapes and dtypes, no data,
no compute), so a training step costs milliseconds whatever the model's size, and every tensor the
CUDA run would hold in device memory is a meta tensor whose storage is recorded when an ATen operator
creates it and freed when PyTorch releases it (see ``tracker``). The rewrites that keep the CUDA code
path (the ``foreach`` optimizers, the fused dropout) and the ``torch.cuda`` calls a script makes are in
``devicemap``; ``child`` runs the script in its own process.
"""

FORMAT = "torch-capture"

__all__ = ["FORMAT"]
