"""Which torch device computes: ``auto`` is CUDA when a GPU is visible and the work pays for it, else the CPU."""

from __future__ import annotations

import torch

from ..core.errors import DeviceError

DEVICES = "auto, cpu, cuda, cuda:N"


def resolve_device(device: str | torch.device = "auto", *, gpu_pays: bool = True) -> torch.device:
    """The device ``device`` names, checked once: asking for CUDA without a visible GPU is a one-line
    error rather than a failure deep inside the first product. ``auto``: CUDA where a GPU is visible and
    ``gpu_pays`` (the caller's work is faster there: :func:`gpu_pays_for`), else the CPU."""
    name = str(device)
    if name == "auto":
        return torch.device("cuda" if gpu_pays and torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device must be one of {DEVICES}, not {name!r}") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {name!r}", "no CUDA GPU is visible to torch here; use --device cpu (or auto)")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise DeviceError(f"device {name!r}", f"only {torch.cuda.device_count()} CUDA GPU(s) are visible")
    elif resolved.type != "cpu":
        raise ValueError(f"device must be one of {DEVICES}, not {name!r}")
    return resolved


def gpu_pays_for(uses_svd: bool) -> bool:
    """Whether embedding is faster on a GPU than on the CPU: only where each delta is decomposed whole (the SVD
    factors). A sketch reads a few rows of each matrix and adds them into buckets, work a GPU waits on transfers
    and kernel launches for: an 8B fine-tune took 2.7-3.5 s a model on an H200 and 1.5 s on its machine's 16 CPU
    cores (issue 49's measurement; 0.8 s of embedding against 2.1-2.7 s)."""
    return uses_svd
