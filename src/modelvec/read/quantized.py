"""GPTQ, AWQ and bitsandbytes checkpoints, read as the float weights they round, a few rows at a time.

:class:`QuantizedCheckpoint` opens a safetensors (or ``.bin``) folder whose config names its quantization
(:func:`~modelvec.core.quantized.quant_config`) and offers every linear the scheme stores
(:data:`~modelvec.read.quant_schemes.SCHEMES`) under its Hugging Face name, ``<module>.weight``, of shape
``[out, in]``: every rule of :class:`~modelvec.read.checkpoint.Checkpoint` (layout, orientation, fused parts) applies
as is, and tensors left unquantized (norms, embeddings, a head in ``modules_to_not_convert``) are read as stored.

``get_stored(key, whole=False)`` is a view whose row slices dequantize only those rows (:class:`QuantRows`) from the
bytes they need (:meth:`~QuantizedCheckpoint.byte_ranges`: a piece of every packed row of GPTQ's and AWQ's ``qweight``,
the rows' own range of bitsandbytes' weights, the scales and zeros of those rows, the small tensors whole), which is
what a partial download of a Hub repository fetches. A linear whose tensors do not fit together is a one-line
:class:`~modelvec.core.errors.CheckpointError` naming the tensor; ``quantized_types()`` names the quantization
("GPTQ 4-bit g128"), so a run records the model as a quantization and the rank study warns.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.errors import CheckpointError, shown
from ..core.quantized import quant_config
from ..core.spans import merge
from .checkpoint import Checkpoint, Stored
from .quant_schemes import NUMPY, SCHEMES, Part, QLinear, QuantFault

PathLike = str | os.PathLike[str]
_TORCH_NAMES = {
    "torch.int32": "I32",
    "torch.uint8": "U8",
    "torch.int8": "I8",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.float32": "F32",
}


class QuantizedCheckpoint(Checkpoint):
    """A GPTQ, AWQ or bitsandbytes checkpoint whose quantized linears read as their dequantized ``[out, in]`` rows."""

    def __init__(self, path: PathLike, name: str | None = None) -> None:
        super().__init__(path, name)
        config = quant_config(self.folder)
        if config is None:
            raise CheckpointError(self.name, "names no quantization (gptq, awq or bitsandbytes) in its config")
        self.quantization = config
        self._raws: dict[str, np.ndarray] = {}  # small tensors read whole (g_idx, quant maps), by name
        self.linears = self._find_linears()
        self._parts = {part.name for ql in self.linears.values() for part in ql.parts.values()}

    # --- the linears ----------------------------------------------------------------------------
    def _stored_parts(self) -> dict[str, Part]:
        """Every stored tensor's place (from the safetensors headers; a ``.bin``'s through torch)."""
        parts: dict[str, Part] = {}
        for file in self.files:
            header = self._header(file)
            if header is None:
                handle = self._open(file)
                for key in handle:
                    t = handle[key]
                    dtype = _TORCH_NAMES.get(str(t.dtype), str(t.dtype))
                    parts[key] = Part(key, dtype, tuple(t.shape), file, -1, t.numel() * t.element_size())
                continue
            for key, entry in header.items():
                begin, end = entry["data_offsets"]
                parts[key] = Part(key, entry["dtype"], tuple(int(d) for d in entry["shape"]), file, begin, end - begin)
        return parts

    def _find_linears(self) -> dict[str, QLinear]:
        method = self.quantization["quant_method"]
        parts = self._stored_parts()
        found: dict[str, QLinear] = {}
        for name in sorted(parts):
            for scheme in SCHEMES[method]:
                module = scheme.module_of(name)
                if module is None:
                    continue
                try:
                    ql = scheme.linear(module, parts, self.quantization, self._state_bytes)
                except QuantFault as fault:
                    raise CheckpointError(self.name, f"{method}: {fault}") from None
                found[ql.key] = ql
        return found

    def _state_bytes(self, part: Part) -> np.ndarray:
        """A quantization state's bytes (a partial download must hold them: it fetches them with the headers)."""
        if self.fetched is not None and part.offset >= 0:
            start = self._data_starts[part.file] + part.offset
            held = self.fetched.get(part.file, [])
            if not any(a <= start and start + part.nbytes <= b for a, b in held):
                raise CheckpointError(
                    self.name, f"the quantization state {shown(part.name)} was not fetched: embed it again to fetch it"
                )
        return self._raw(part)

    def _raw(self, part: Part) -> np.ndarray:
        """A stored tensor whole, as numpy reads its dtype: a view of the mapped file (a ``.bin``'s through torch)."""
        if part.offset < 0:
            cached = self._raws.get(part.name)
            if cached is None:
                t = self._open(part.file)[part.name]
                t = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
                cached = self._raws[part.name] = t.numpy().view(NUMPY[part.dtype])
            return cached
        if part.dtype not in NUMPY:
            raise CheckpointError(
                self.name, f"tensor {shown(part.name)} has dtype {part.dtype}, not one a scheme reads"
            )
        pages = self._maps.get(part.file)
        if pages is None:
            with open(part.file, "rb") as fh:
                pages = self._maps[part.file] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        dtype = np.dtype(NUMPY[part.dtype])
        count = part.nbytes // dtype.itemsize
        at = self._data_starts[part.file] + part.offset
        return np.frombuffer(pages, dtype=dtype, count=count, offset=at).reshape(part.shape)

    # --- the Checkpoint interface -----------------------------------------------------------------
    def keys(self) -> set[str]:
        """The stored tensors, each quantized linear's under its Hugging Face name instead of its parts'."""
        return (super().keys() - self._parts) | set(self.linears)

    def shape(self, key: str) -> tuple[int, ...]:
        ql = self.linears.get(key)
        return ql.shape if ql is not None else super().shape(key)

    def _file_of(self, key: str) -> Path:
        ql = self.linears.get(key) if hasattr(self, "linears") else None
        if ql is not None:
            return next(iter(ql.parts.values())).file
        return super()._file_of(key)

    def stored(self, key: str) -> Stored | None:
        """None for a quantized linear (read through :meth:`get_stored`, dequantized), else as stored."""
        return None if key in self.linears else super().stored(key)

    def get(self, key: str) -> torch.Tensor:
        if key in self.linears:
            return self.get_stored(key)
        return super().get(key)

    def get_stored(self, key: str, *, whole: bool = True) -> Any:
        """A quantized linear dequantized (float32, ``[out, in]``); ``whole=False``: a view that dequantizes only the
        rows sliced from it (:class:`QuantRows`). Other tensors as :class:`Checkpoint` reads them."""
        ql = self.linears.get(key)
        if ql is None:
            return super().get_stored(key, whole=whole)
        view = QuantRows(self, ql)
        if not whole:
            return view
        self.require_rows({key: [(0, ql.shape[0])]})
        return view[0 : ql.shape[0]]

    def rows(self, key: str, rows: np.ndarray) -> torch.Tensor:
        """Rows ``rows`` of quantized linear ``key``, dequantized (float32, ``[len(rows), in]``)."""
        ql = self.linears[key]
        try:
            return ql.scheme.rows(ql, self._raw, np.asarray(rows, dtype=np.int64))
        except QuantFault as fault:
            raise CheckpointError(self.name, f"{self.quantization['quant_method']}: {fault}") from None

    def byte_ranges(self, rows: Mapping[str, Sequence[tuple[int, int]]]) -> dict[Path, list[tuple[int, int]]] | None:
        """Where the given rows' bytes lie: for a quantized linear, each of its tensors' pieces those rows need
        (:meth:`~modelvec.read.quant_schemes.Scheme.spans`); other tensors' rows as :class:`Checkpoint` says. None
        where a file is a ``.bin``."""
        plain = {k: r for k, r in rows.items() if k not in self.linears}
        out = super().byte_ranges(plain) if plain else {}
        if out is None:
            return None
        spans: dict[Path, list[tuple[int, int]]] = {f: list(s) for f, s in out.items()}
        for key, ranges in rows.items():
            ql = self.linears.get(key)
            if ql is None:
                continue
            for part, pieces in ql.scheme.spans(ql, merge(ranges)):
                if part.offset < 0:
                    return None
                start = self._data_starts[part.file] + part.offset
                spans.setdefault(part.file, []).extend((start + a, start + b) for a, b in pieces)
        return {file: merge(s) for file, s in spans.items()}

    def quantized_types(self) -> list[str]:
        """The quantizations of the layout's matrices ("GPTQ 4-bit g128", "bitsandbytes nf4"...)."""
        layout = self.layout()
        return sorted({self.linears[k].kind for r in layout.refs if (k := layout.prefix + r.tensor) in self.linears})

    def close(self) -> None:
        super().close()
        self._raws.clear()


class QuantRows:
    """A quantized matrix read a few rows at a time: slicing rows (and columns) dequantizes only those rows, as a
    float32 tensor; what the embedder's row plans read."""

    ndim = 2

    def __init__(self, ck: QuantizedCheckpoint, ql: QLinear) -> None:
        self.ck, self.key = ck, ql.key
        self.shape = torch.Size(ql.shape)
        self.dtype = torch.float32

    def __getitem__(self, index: Any) -> torch.Tensor:
        rows, cols = index if isinstance(index, tuple) else (index, slice(None))
        if not isinstance(rows, slice):
            raise TypeError("quantized rows are read by slices of rows")
        wanted = np.arange(self.shape[0])[rows]
        return self.ck.rows(self.key, wanted)[:, cols]
