"""Which torch device computes: ``auto`` is CUDA when a GPU is visible, else the CPU."""

from __future__ import annotations

import torch

from ..core.errors import DeviceError

DEVICES = "auto, cpu, cuda, cuda:N"


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """The device ``device`` names, checked once: asking for CUDA without a visible GPU is a one-line
    error rather than a failure deep inside the first product."""
    name = str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
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
