"""``--device auto`` is never slower than the CPU: it picks a visible GPU only for work that is faster there (the
SVD factors of whole deltas; products of enough multiply-adds to pay for starting CUDA), the CPU otherwise."""

from __future__ import annotations

import pytest
import torch

from modelvec.core.errors import DeviceError
from modelvec.represent import DeltaEmbedder
from modelvec.represent.device import resolve_device
from modelvec.store.derived import products


@pytest.fixture
def visible_gpu(monkeypatch):
    """torch told a GPU is visible (nothing runs on it: the tests only resolve names)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_auto_embeds_a_sketch_on_the_cpu_and_svd_factors_on_a_visible_gpu(visible_gpu):
    assert DeltaEmbedder(device="auto").device.type == "cpu"  # the default: a sketch of a few rows
    assert DeltaEmbedder(device="auto", factor="U").device.type == "cuda"
    assert DeltaEmbedder(device="cuda").device.type == "cuda"  # asked for: always
    assert resolve_device("auto", gpu_pays=False).type == "cpu"


def test_auto_embeds_on_the_cpu_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert DeltaEmbedder(device="auto", factor="U").device.type == "cpu"
    with pytest.raises(DeviceError, match="no CUDA GPU"):
        DeltaEmbedder(device="cuda")


def test_auto_runs_the_products_on_a_gpu_only_when_they_pay_for_starting_it(visible_gpu):
    assert products.resolved_device("auto", products.GPU_FROM - 1) == "cpu"
    assert products.resolved_device("auto", products.GPU_FROM) == "cuda"
    assert products.resolved_device("cuda", 1) == "cuda"
    assert products.resolved_device("cpu", 10 * products.GPU_FROM) == "cpu"
