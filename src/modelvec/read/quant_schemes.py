"""How GPTQ, AWQ and bitsandbytes store a quantized ``nn.Linear`` (``W [out, in]``), and how rows of W are read from
those bytes alone: one entry a scheme, :data:`SCHEMES` by ``quant_method``.

Each scheme finds the linears it stores (:meth:`Scheme.module_of`: by the name of one of its tensors), checks their
tensors against each other from the header alone (:meth:`Scheme.linear`), says which bytes of each tensor some rows
of W need (:meth:`Scheme.spans`) and dequantizes those rows as the reference implementation dequantizes the whole
matrix (:meth:`Scheme.rows`), rounded to the same dtype:

- **GPTQ** (auto-gptq, gptqmodel; ``checkpoint_format`` gptq or gptq_v2): ``qweight`` int32 ``[in*bits/32, out]``
  packed along the input, low bits first; ``qzeros`` int32 ``[groups, out*bits/32]`` (gptq: the zero minus 1);
  ``scales`` ``[groups, out]``; ``g_idx`` int32 ``[in]``, each input's group (act-order permutes it). 2, 4, 8 bits.
- **AWQ** GEMM (autoawq): ``qweight`` int32 ``[in, out/8]`` packed along the output in AWQ's order
  (0, 2, 4, 6, 1, 3, 5, 7); ``qzeros`` ``[in/group, out/8]`` alike; ``scales`` ``[in/group, out]``. 4 bits.
- **bitsandbytes** 4-bit (nf4, fp4): ``weight`` uint8, two values a byte (the first in the high nibble), W's rows
  flattened; ``weight.absmax`` a block's scale (float32, or uint8 dequantized through ``nested_absmax`` and
  ``nested_quant_map`` plus an offset: double quantization); ``weight.quant_map`` the 16 values;
  ``weight.quant_state.bitsandbytes__<type>`` a JSON (blocksize, dtype, shape...). 8-bit (LLM.int8): ``weight`` int8
  ``[out, in]``, ``SCB`` a row's scale (W = int8 x SCB / 127).

W's rows are GPTQ's and AWQ's columns: a row's bytes are a piece of every packed row (many small pieces);
bitsandbytes stores W's rows in order, so theirs are one range.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.errors import QuantFault, shown
from ..core.quantized import STATE

#: safetensors dtypes as numpy reads their bytes (bfloat16 as its bits).
NUMPY = {"I32": np.int32, "U8": np.uint8, "I8": np.int8, "F16": np.float16, "BF16": np.uint16, "F32": np.float32}
_FLOATS = ("F16", "BF16", "F32")
_TORCH = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}
_BNB_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
#: Where AWQ packs output ``8c + t``: the nibble ``REVERSE[t]`` of column c (autoawq's AWQ_REVERSE_ORDER).
_AWQ_REVERSE = np.array([0, 4, 1, 5, 2, 6, 3, 7])


@dataclass(frozen=True)
class Part:
    """One stored tensor: its name, dtype, shape, file and byte offset and length from the file's data start."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    offset: int
    nbytes: int


@dataclass
class QLinear:
    """One quantized linear, standing for ``key`` (``<module>.weight``, ``shape`` = ``[out, in]``)."""

    key: str
    scheme: Scheme
    parts: dict[str, Part]
    shape: tuple[int, int]
    kind: str  # "GPTQ 4-bit g128", "bitsandbytes nf4 double-quantized"...
    info: dict[str, Any] = field(default_factory=dict)


Raw = Callable[[Part], np.ndarray]  # a stored tensor, whole, as numpy reads it (a view of the file where it can be)
Spans = list[tuple[Part, list[tuple[int, int]]]]


def _tensor(raw: np.ndarray, dtype: str) -> torch.Tensor:
    """A copy of a float tensor's stored values in their own dtype (bfloat16 from its bits)."""
    values = torch.from_numpy(np.array(raw))
    return values.view(torch.bfloat16) if dtype == "BF16" else values


def _need(parts: Mapping[str, Part], module: str, suffix: str, what: str) -> Part:
    part = parts.get(module + suffix)
    if part is None:
        raise QuantFault(f"missing tensor {module + suffix} ({what})")
    return part


def _check(part: Part, dtypes: Sequence[str], shape: tuple[int, ...] | None = None, what: str = "") -> None:
    if part.dtype not in dtypes:
        raise QuantFault(f"tensor {part.name} has dtype {part.dtype}, expected {' or '.join(dtypes)}")
    if shape is not None and part.shape != shape:
        raise QuantFault(f"tensor {part.name} has shape {list(part.shape)}, expected {list(shape)}{what}")


def _packed(parts: Mapping[str, Part], module: str, whose: str) -> tuple[Part, Part, Part]:
    """A packed linear's ``qweight``, ``scales`` and ``qzeros`` (GPTQ's and AWQ's), the scales float, both matrices."""
    qweight = _need(parts, module, ".qweight", f"{whose} packed weights")
    scales = _need(parts, module, ".scales", f"{whose} scales")
    qzeros = _need(parts, module, ".qzeros", f"{whose} zeros")
    _check(scales, _FLOATS)
    if len(scales.shape) != 2 or len(qweight.shape) != 2:
        raise QuantFault(f"tensor {qweight.name} or {scales.name} is not a matrix")
    return qweight, scales, qzeros


def _count(config: Mapping[str, Any], key: str, default: int) -> int:
    """A count of the quantization config (``bits``), checked."""
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise QuantFault(f"quantization config's {key} is {shown(repr(value), 40)}, not a count")
    return value


def _grid(rows: int, row_bytes: int, ranges: Sequence[tuple[int, int]], item: int) -> list[tuple[int, int]]:
    """The byte ranges of columns ``ranges`` (in elements of ``item`` bytes) of every row of a 2-D tensor."""
    starts = np.arange(rows, dtype=np.int64)[:, None] * row_bytes
    out = []
    for a, b in ranges:
        out += [(int(s) + a * item, int(s) + b * item) for s in starts[:, 0]]
    return out


class Scheme:
    """One way of storing a quantized linear (see the module's docstring)."""

    method: str
    anchor: str  # the suffix of the tensor a linear stored so is found by

    def module_of(self, name: str) -> str | None:
        return name[: -len(self.anchor)] if name.endswith(self.anchor) else None

    def linear(self, module: str, parts: Mapping[str, Part], config: Mapping[str, Any], state: Raw) -> QLinear:
        raise NotImplementedError

    def spans(self, ql: QLinear, ranges: Sequence[tuple[int, int]]) -> Spans:
        raise NotImplementedError

    def rows(self, ql: QLinear, raw: Raw, rows: np.ndarray) -> torch.Tensor:
        raise NotImplementedError


class GPTQ(Scheme):
    method, anchor = "gptq", ".qweight"

    def linear(self, module: str, parts: Mapping[str, Part], config: Mapping[str, Any], state: Raw) -> QLinear:
        bits = _count(config, "bits", 4)
        if bits not in (2, 4, 8):
            raise QuantFault(f"{bits}-bit GPTQ (read: 2, 4 and 8 bits)")
        fmt = str(config.get("checkpoint_format") or config.get("format") or "gptq").lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise QuantFault(f"GPTQ checkpoint_format '{fmt}' (read: gptq, gptq_v2)")
        qweight, scales, qzeros = _packed(parts, module, "a GPTQ linear's")
        groups, out = scales.shape
        per = 32 // bits
        g_idx = parts.get(module + ".g_idx")
        if g_idx is not None:
            _check(g_idx, ("I32",))
        inputs = g_idx.shape[0] if g_idx is not None and len(g_idx.shape) == 1 else qweight.shape[0] * per
        if out % per or inputs % per:
            raise QuantFault(f"tensor {qweight.name}: [{out}, {inputs}] does not pack into {bits}-bit words")
        said = f" ({bits}-bit, {inputs} inputs and {out} outputs as {(g_idx or scales).name} says)"
        _check(qweight, ("I32",), (inputs // per, out), said)
        _check(qzeros, ("I32",), (groups, out // per), f" ({groups} groups, {out} outputs at {bits} bits)")
        if g_idx is not None:
            _check(g_idx, ("I32",), (inputs,), " (one group an input)")
        elif inputs % groups:
            raise QuantFault(f"tensor {scales.name}: {groups} groups do not divide {inputs} inputs")
        named = {"qweight": qweight, "qzeros": qzeros, "scales": scales, **({"g_idx": g_idx} if g_idx else {})}
        group = inputs // groups
        kind = (
            f"GPTQ {bits}-bit" + (f" g{group}" if groups > 1 else "") + (" act-order" if config.get("desc_act") else "")
        )
        info = {"bits": bits, "group": group, "offset": 1 if fmt == "gptq" else 0}
        return QLinear(module + ".weight", self, named, (out, inputs), kind, info)

    def spans(self, ql: QLinear, ranges: Sequence[tuple[int, int]]) -> Spans:
        p = ql.parts
        per = 32 // ql.info["bits"]
        out = ql.shape[0]
        zeros = [(a // per, -(-b // per)) for a, b in ranges]
        item = 2 if p["scales"].dtype != "F32" else 4
        spans: Spans = [
            (p["qweight"], _grid(p["qweight"].shape[0], out * 4, ranges, 4)),
            (p["qzeros"], _grid(p["qzeros"].shape[0], p["qzeros"].shape[1] * 4, zeros, 4)),
            (p["scales"], _grid(p["scales"].shape[0], out * item, ranges, item)),
        ]
        if "g_idx" in p:
            spans.append((p["g_idx"], [(0, p["g_idx"].nbytes)]))
        return spans

    def rows(self, ql: QLinear, raw: Raw, rows: np.ndarray) -> torch.Tensor:
        p, bits = ql.parts, ql.info["bits"]
        per, mask = 32 // bits, (1 << bits) - 1
        shifts = torch.arange(0, 32, bits, dtype=torch.int32)
        packed = torch.from_numpy(np.ascontiguousarray(raw(p["qweight"])[:, rows]))
        q = ((packed[:, None, :] >> shifts[None, :, None]) & mask).reshape(-1, len(rows))  # [in, rows]
        where = torch.from_numpy((bits * (rows % per)).astype(np.int32))
        z = ((torch.from_numpy(np.ascontiguousarray(raw(p["qzeros"])[:, rows // per])) >> where) & mask) + ql.info[
            "offset"
        ]
        scales = _tensor(raw(p["scales"])[:, rows], p["scales"].dtype)
        g = self._groups(ql, raw)
        w = scales[g] * (q - z[g]).to(scales.dtype)  # in the scales' dtype, as auto-gptq's QuantLinear
        return w.T.float().contiguous()

    def _groups(self, ql: QLinear, raw: Raw) -> torch.Tensor:
        inputs = ql.shape[1]
        if "g_idx" not in ql.parts:
            return torch.arange(inputs) // ql.info["group"]
        g = torch.from_numpy(np.array(raw(ql.parts["g_idx"]))).long()
        groups = ql.parts["scales"].shape[0]
        if bool(((g < 0) | (g >= groups)).any()):
            bad = int(g[(g < 0) | (g >= groups)][0])
            raise QuantFault(f"tensor {ql.parts['g_idx'].name} names group {bad} of {groups}")
        return g


class AWQ(Scheme):
    method, anchor = "awq", ".qweight"

    def linear(self, module: str, parts: Mapping[str, Part], config: Mapping[str, Any], state: Raw) -> QLinear:
        bits = _count(config, "bits", 4)
        version = str(config.get("version") or "gemm").lower()
        if version != "gemm" or bits != 4:
            raise QuantFault(f"AWQ version '{version}' at {bits} bits (read: gemm, 4 bits)")
        qweight, scales, qzeros = _packed(parts, module, "an AWQ linear's")
        groups, out = scales.shape
        inputs = qweight.shape[0]
        _check(qweight, ("I32",), (inputs, out // 8), f" ({out} outputs as {scales.name} says, 8 a word)")
        _check(qzeros, ("I32",), (groups, out // 8), f" ({groups} groups, {out} outputs, 8 a word)")
        if out % 8 or inputs % groups:
            raise QuantFault(f"tensor {scales.name}: [{groups}, {out}] does not fit {inputs} inputs in 4-bit words")
        group = inputs // groups
        named = {"qweight": qweight, "qzeros": qzeros, "scales": scales}
        return QLinear(module + ".weight", self, named, (out, inputs), f"AWQ 4-bit g{group}", {"group": group})

    def spans(self, ql: QLinear, ranges: Sequence[tuple[int, int]]) -> Spans:
        p = ql.parts
        words = [(a // 8, -(-b // 8)) for a, b in ranges]
        item = 2 if p["scales"].dtype != "F32" else 4
        return [
            (p["qweight"], _grid(p["qweight"].shape[0], p["qweight"].shape[1] * 4, words, 4)),
            (p["qzeros"], _grid(p["qzeros"].shape[0], p["qzeros"].shape[1] * 4, words, 4)),
            (p["scales"], _grid(p["scales"].shape[0], ql.shape[0] * item, ranges, item)),
        ]

    def rows(self, ql: QLinear, raw: Raw, rows: np.ndarray) -> torch.Tensor:
        p = ql.parts
        where = torch.from_numpy((4 * _AWQ_REVERSE[rows % 8]).astype(np.int32))
        cols = rows // 8
        q = (torch.from_numpy(np.ascontiguousarray(raw(p["qweight"])[:, cols])) >> where) & 15  # [in, rows]
        z = (torch.from_numpy(np.ascontiguousarray(raw(p["qzeros"])[:, cols])) >> where) & 15  # [groups, rows]
        scales = _tensor(raw(p["scales"])[:, rows], p["scales"].dtype)
        g = torch.arange(ql.shape[1]) // ql.info["group"]
        w = (q - z[g]).to(scales.dtype) * scales[g]  # as autoawq's dequantize_gemm
        return w.T.float().contiguous()


class BnB4(Scheme):
    method, anchor = "bitsandbytes", ""

    def module_of(self, name: str) -> str | None:
        head, found, kind = name.rpartition(".weight" + STATE)
        return head if found and kind in ("nf4", "fp4") else None

    def linear(self, module: str, parts: Mapping[str, Part], config: Mapping[str, Any], state: Raw) -> QLinear:
        kind = next(n.rsplit("__", 1)[1] for n in parts if n.startswith(module + ".weight" + STATE))
        js = _state(state(parts[f"{module}.weight{STATE}{kind}"]), f"{module}.weight{STATE}{kind}")
        weight = _need(parts, module, ".weight", "the packed 4-bit weights")
        absmax = _need(parts, module, ".weight.absmax", "the blocks' scales")
        qmap = _need(parts, module, ".weight.quant_map", "the 4-bit values")
        _check(qmap, ("F32",), (16,))
        shape, block = js["shape"], js["blocksize"]
        n = shape[0] * shape[1]
        if weight.nbytes < -(-n // 2):
            raise QuantFault(f"tensor {weight.name} holds {weight.nbytes:,} bytes, not the {-(-n // 2):,} of {shape}")
        nested = module + ".weight.nested_absmax" in parts
        _check(absmax, ("U8",) if nested else ("F32",), (-(-n // block),), f" (blocks of {block} of {shape})")
        named = {"weight": weight, "absmax": absmax, "quant_map": qmap}
        if nested:
            nmap = _need(parts, module, ".weight.nested_quant_map", "the nested blocks' values")
            nabs = parts[module + ".weight.nested_absmax"]
            if "nested_blocksize" not in js or "nested_offset" not in js:
                raise QuantFault(f"the quantization state of {module}.weight names no nested blocksize or offset")
            _check(nmap, ("F32",), (256,))
            _check(nabs, ("F32",), (-(-absmax.shape[0] // int(js["nested_blocksize"])),))
            named |= {"nested_absmax": nabs, "nested_quant_map": nmap}
        named["state"] = parts[f"{module}.weight{STATE}{kind}"]
        label = f"bitsandbytes {js['quant_type']}" + (" double-quantized" if nested else "")
        return QLinear(module + ".weight", self, named, (shape[0], shape[1]), label, js)

    def spans(self, ql: QLinear, ranges: Sequence[tuple[int, int]]) -> Spans:
        p, m, block = ql.parts, ql.shape[1], ql.info["blocksize"]
        item = 1 if "nested_absmax" in p else 4
        out: Spans = [
            (p["weight"], [(a * m // 2, -(-b * m // 2)) for a, b in ranges]),
            (p["absmax"], [(a * m // block * item, -(-b * m // block) * item) for a, b in ranges]),
        ]
        return out + [
            (p[k], [(0, p[k].nbytes)]) for k in ("quant_map", "nested_absmax", "nested_quant_map", "state") if k in p
        ]

    def rows(self, ql: QLinear, raw: Raw, rows: np.ndarray) -> torch.Tensor:
        p, m, block = ql.parts, ql.shape[1], ql.info["blocksize"]
        v = rows.astype(np.int64)[:, None] * m + np.arange(m, dtype=np.int64)[None, :]
        packed = raw(p["weight"]).reshape(-1).view(np.uint8)[v >> 1]
        nibble = np.where(v & 1, packed & 15, packed >> 4)
        blocks = v // block
        if "nested_absmax" in p:
            nested = np.float32(ql.info["nested_offset"])
            outer = raw(p["nested_absmax"])[blocks // int(ql.info["nested_blocksize"])]
            absmax = raw(p["nested_quant_map"])[raw(p["absmax"])[blocks]] * outer + nested
        else:
            absmax = raw(p["absmax"])[blocks]
        values = raw(p["quant_map"])[nibble] * absmax  # float32, as bitsandbytes' dequantize_4bit
        return torch.from_numpy(values).to(_BNB_DTYPES[ql.info["dtype"]]).float()


class BnB8(Scheme):
    method, anchor = "bitsandbytes", ".SCB"

    def linear(self, module: str, parts: Mapping[str, Part], config: Mapping[str, Any], state: Raw) -> QLinear:
        weight = _need(parts, module, ".weight", "the int8 weights")
        scb = parts[module + ".SCB"]
        if len(weight.shape) != 2:
            raise QuantFault(f"tensor {weight.name} has shape {list(weight.shape)}, expected a matrix")
        _check(weight, ("I8",))
        _check(scb, ("F32",), (weight.shape[0],), f" (a scale a row of {weight.name})")
        shape = (weight.shape[0], weight.shape[1])
        named = {"weight": weight, "SCB": scb}
        if module + ".weight_format" in parts:  # its row-major layout's mark (0), saved for older readers
            named["format"] = parts[module + ".weight_format"]
        return QLinear(module + ".weight", self, named, shape, "bitsandbytes int8")

    def spans(self, ql: QLinear, ranges: Sequence[tuple[int, int]]) -> Spans:
        m = ql.shape[1]
        return [
            (ql.parts["weight"], [(a * m, b * m) for a, b in ranges]),
            (ql.parts["SCB"], [(a * 4, b * 4) for a, b in ranges]),
        ]

    def rows(self, ql: QLinear, raw: Raw, rows: np.ndarray) -> torch.Tensor:
        q = raw(ql.parts["weight"])[rows].astype(np.float32)
        values = q * raw(ql.parts["SCB"])[rows][:, None] * np.float32(7.874015718698502e-3)  # bitsandbytes' 1/127
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


def _state(raw: np.ndarray, name: str) -> dict[str, Any]:
    """A bitsandbytes quantization state (its JSON bytes), checked."""
    import json

    try:
        js = json.loads(bytes(np.asarray(raw, dtype=np.uint8)).decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise QuantFault(f"tensor {name} is not a JSON quantization state") from None
    shape = js.get("shape") if isinstance(js, dict) else None
    block = js.get("blocksize") if isinstance(js, dict) else None
    ok = (
        isinstance(shape, list)
        and len(shape) == 2
        and all(isinstance(d, int) and d > 0 for d in shape)
        and isinstance(block, int)
        and block > 0
        and js.get("quant_type") in ("nf4", "fp4")
        and js.get("dtype") in _BNB_DTYPES
        and (
            "nested_blocksize" not in js
            or (
                (isinstance(js["nested_blocksize"], int) and js["nested_blocksize"] > 0)
                and isinstance(js.get("nested_offset"), (int, float))
            )
        )
    )
    if not ok:
        raise QuantFault(f"tensor {name} is not a sound quantization state (quant_type, blocksize, dtype, 2-D shape)")
    return js


#: The schemes a ``quant_method`` stores its linears in.
SCHEMES: dict[str, tuple[Scheme, ...]] = {"gptq": (GPTQ(),), "awq": (AWQ(),), "bitsandbytes": (BnB4(), BnB8())}
