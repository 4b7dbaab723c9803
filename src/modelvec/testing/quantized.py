"""Safetensors folders written as GPTQ, AWQ and bitsandbytes checkpoints of a float one, packed as the reference
implementations pack them: auto-gptq's ``QuantLinear.pack`` (its RTN quantizer's scales and zeros, act-order's
``g_idx``), autoawq's ``WQLinear_GEMM.from_linear`` (its ``pseudo_quantize_tensor``'s), and bitsandbytes' own
``quantize_4bit`` / ``int8_vectorwise_quant`` with the state dict its ``Linear4bit`` and ``Linear8bitLt`` save; each
with the ``quantization_config`` transformers writes into config.json (or auto-gptq's ``quantize_config.json``).

For the tests and the evidence (modelvec reads these formats with :mod:`modelvec.read.quantized`; it writes none).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

#: Where autoawq packs output ``8c + order[i]``: nibble i of column c.
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def quantized_names(state: dict[str, torch.Tensor], skip: tuple[str, ...] = ("embed", "lm_head")) -> list[str]:
    """The linears a quantizer rounds: every 2-D ``.weight`` but the embeddings and the head."""
    return [k for k, v in state.items() if k.endswith(".weight") and v.ndim == 2 and not any(s in k for s in skip)]


def _groups(inputs: int, group: int, desc_act: bool, seed: int) -> torch.Tensor:
    """GPTQ's ``g_idx``: input i's group; with act-order, the groups of the inputs taken in a permuted order."""
    group = inputs if group == -1 else group
    g_idx = torch.arange(inputs, dtype=torch.int32) // group
    if desc_act:
        perm = torch.randperm(inputs, generator=torch.Generator().manual_seed(seed))
        g_idx = g_idx[torch.argsort(perm)]
    return g_idx


def gptq_params(w: torch.Tensor, bits: int, g_idx: torch.Tensor, sym: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales and zeros ``[out, groups]`` of auto-gptq's ``Quantizer.find_params`` (per output, per group)."""
    maxq = 2**bits - 1
    groups = int(g_idx.max()) + 1
    scales = torch.zeros(w.shape[0], groups)
    zeros = torch.zeros(w.shape[0], groups)
    x = w.float()
    for g in range(groups):
        cols = x[:, g_idx == g]
        xmin = torch.minimum(cols.min(1).values, torch.zeros(1))
        xmax = torch.maximum(cols.max(1).values, torch.zeros(1))
        if sym:
            xmax = torch.maximum(xmin.abs(), xmax)
            xmin = torch.where(xmin < 0, -xmax, xmin)
        same = (xmin == 0) & (xmax == 0)
        xmin[same], xmax[same] = -1.0, 1.0
        scale = (xmax - xmin) / maxq
        zero = torch.full_like(scale, (maxq + 1) / 2) if sym else torch.round(-xmin / scale)
        scales[:, g], zeros[:, g] = scale, zero
    return scales, zeros


def pack_gptq(
    w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor, bits: int, *, v2: bool = False
) -> dict[str, torch.Tensor]:
    """auto-gptq's ``QuantLinear.pack`` (qlinear_cuda): ``w [out, in]`` in its dtype, ``scales``/``zeros`` ``[out,
    groups]``; the zeros stored minus 1 (``checkpoint_format: gptq``), or as they are (``gptq_v2``)."""
    per = 32 // bits
    scales_t = scales.t().contiguous()
    zeros_t = zeros.t().contiguous()
    scale_zeros = zeros_t * scales_t
    stored_scales = scales_t.clone().to(dtype=w.dtype)
    g = g_idx.long()
    intweight = torch.round((w.t() + scale_zeros[g]) / stored_scales[g]).to(torch.int)
    intweight = intweight.clamp(0, 2**bits - 1).numpy().astype(np.uint32)  # [in, out]
    qweight = np.zeros((intweight.shape[0] // per, intweight.shape[1]), dtype=np.uint32)
    for j in range(per):
        qweight |= intweight[j::per] << np.uint32(bits * j)
    z = (zeros_t - (0 if v2 else 1)).numpy().astype(np.int64).astype(np.uint32)  # -1 wraps, as auto-gptq's does
    qzeros = np.zeros((z.shape[0], z.shape[1] // per), dtype=np.uint32)
    for j in range(per):
        qzeros |= z[:, j::per] << np.uint32(bits * j)
    return {
        "qweight": torch.from_numpy(qweight.astype(np.int32)),
        "qzeros": torch.from_numpy(qzeros.astype(np.int32)),
        "scales": stored_scales,
        "g_idx": g_idx.to(torch.int32),
    }


def awq_params(w: torch.Tensor, group: int, bits: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """autoawq's ``pseudo_quantize_tensor`` (zero point, per group): the rounded weight (what its quantizer packs),
    and the scales and zeros ``[groups, out]`` it packs with."""
    out, inputs = w.shape
    x = w.float().reshape(-1, group)
    max_val, min_val = x.amax(dim=1, keepdim=True), x.amin(dim=1, keepdim=True)
    max_int, min_int = 2**bits - 1, 0
    scales = (max_val - min_val).clamp(min=1e-5) / max_int
    zeros = (-torch.round(min_val / scales)).clamp_(min_int, max_int)
    rounded = ((torch.clamp(torch.round(x / scales) + zeros, min_int, max_int) - zeros) * scales).reshape(out, inputs)
    return rounded.to(w.dtype), scales.view(out, -1).t().contiguous(), zeros.view(out, -1).t().contiguous()


def pack_awq(w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    """autoawq's ``WQLinear_GEMM.from_linear`` (4 bits): ``w [out, in]``, ``scales``/``zeros`` ``[groups, out]``."""
    scale_zeros = zeros * scales
    half = scales.clone().half()
    g = torch.arange(w.shape[1]) // group
    intweight = torch.round((w.t().float() + scale_zeros[g]) / half[g]).to(torch.int).to(torch.int32)  # [in, out]
    qweight = torch.zeros(intweight.shape[0], intweight.shape[1] // 8, dtype=torch.int32)
    qzeros = torch.zeros(zeros.shape[0], zeros.shape[1] // 8, dtype=torch.int32)
    izeros = zeros.to(torch.int32)
    for i in range(8):
        qweight |= intweight[:, AWQ_ORDER[i] :: 8] << (i * 4)
        qzeros |= izeros[:, AWQ_ORDER[i] :: 8] << (i * 4)
    return {"qweight": qweight, "qzeros": qzeros, "scales": half}


def _bnb(w: torch.Tensor, kind: str, nested: bool, blocksize: int) -> dict[str, torch.Tensor]:
    """bitsandbytes' own quantization of one weight, as its Linear4bit / Linear8bitLt saves it."""
    import bitsandbytes.functional as F

    if kind == "int8":
        cb, scb, _ = F.int8_vectorwise_quant(w.to(torch.float16))
        return {"weight": cb, "SCB": scb, "weight_format": torch.tensor(0, dtype=torch.uint8)}
    packed, state = F.quantize_4bit(
        w.contiguous(), blocksize=blocksize, compress_statistics=nested, quant_type=kind, quant_storage=torch.uint8
    )
    return {"weight": packed, **{"weight." + k: v for k, v in state.as_dict(packed=True).items()}}


def _config(method: str, **o) -> dict:
    if method == "gptq":
        fmt = "gptq_v2" if o["v2"] else "gptq"
        return {"quant_method": "gptq", "bits": o["bits"], "group_size": o["group"], "desc_act": o["desc_act"],
                "sym": True, "damp_percent": 0.1, "true_sequential": True, "checkpoint_format": fmt}  # fmt: skip
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": o["group"], "zero_point": True, "version": "gemm",
                "modules_to_not_convert": None}  # fmt: skip
    four = method in ("nf4", "fp4")
    return {"quant_method": "bitsandbytes", "load_in_4bit": four, "load_in_8bit": not four,
            "bnb_4bit_quant_type": method if four else "fp4", "bnb_4bit_use_double_quant": o["nested"],
            "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8", "llm_int8_threshold": 6.0,
            "llm_int8_has_fp16_weight": False, "llm_int8_skip_modules": None}  # fmt: skip


def write_quantized(
    folder: Path,
    out: Path,
    method: str,
    *,
    bits: int = 4,
    group: int = 128,
    desc_act: bool = False,
    v2: bool = False,
    nested: bool = False,
    blocksize: int = 64,
    quantize_config: bool = False,
    seed: int = 0,
) -> Path:
    """The float safetensors folder quantized: ``method`` gptq (``bits``, ``group`` (-1: one a row), ``desc_act``,
    ``v2``), awq (``group``), nf4 / fp4 (``nested``: double quantization; ``blocksize``) or int8. Other files are
    copied; the quantization config goes into config.json, or (``quantize_config``, a GPTQ) beside it as auto-gptq
    0.7 writes it."""
    out.mkdir(parents=True, exist_ok=True)
    state = load_file(str(folder / "model.safetensors"))
    saved: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key not in quantized_names(state):
            saved[key] = value
            continue
        module = key.removesuffix(".weight")
        if method == "gptq":
            g_idx = _groups(value.shape[1], group, desc_act, seed)
            scales, zeros = gptq_params(value, bits, g_idx)
            parts = pack_gptq(value.to(torch.float16), scales, zeros, g_idx, bits, v2=v2)
            saved |= {f"{module}.{k}": v for k, v in parts.items()}
        elif method == "awq":
            rounded, scales, zeros = awq_params(value.to(torch.float16), group)
            saved |= {f"{module}.{k}": v for k, v in pack_awq(rounded, scales, zeros, group).items()}
        else:
            saved |= {f"{module}.{k}": v for k, v in _bnb(value, method, nested, blocksize).items()}
    for item in folder.iterdir():
        if item.name != "model.safetensors" and item.is_file():
            shutil.copyfile(item, out / item.name)
    save_file({k: v.contiguous() for k, v in saved.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    qc = _config(method, bits=bits, group=group, desc_act=desc_act, v2=v2, nested=nested)
    if quantize_config:
        (out / "quantize_config.json").write_text(json.dumps({**qc, "model_file_base_name": "model"}, indent=2))
    else:
        config["quantization_config"] = qc
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
