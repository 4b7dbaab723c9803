"""Checkpoint reading: only the tensors asked for, lazily, never building a ``transformers`` model.

A checkpoint is a local folder (config.json + weights) or a single weights file. Formats:
``model.safetensors``, sharded safetensors with ``model.safetensors.index.json``,
``pytorch_model.bin`` and sharded ``.bin`` with ``pytorch_model.bin.index.json``. safetensors are
memory-mapped and read as zero-copy views in their stored dtype; ``.bin`` files go through
``torch.load(..., weights_only=True, mmap=True)``, which refuses to run pickled code.
"""

from __future__ import annotations

import mmap
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from safetensors import safe_open

from ..core.errors import CheckpointError, raise_if_resource, shown
from .architectures import detect
from .headers import HeaderFault, header_of
from .headers import short_cause as _short
from .layout import Layout, infer_config, resolve_layout
from .planned import PlannedReads
from .roles import Architecture, MatrixRef, Orientation
from .weightfiles import bin_cause, exists, files_fingerprint, files_stamp, load_bin, locate_weights, read_json

if TYPE_CHECKING:  # torch is imported where tensors are read: opening a checkpoint and reading its shapes needs none
    import torch

_FLOAT_DTYPES = ("torch.float32", "torch.float16", "torch.bfloat16", "torch.float64")  # as str(dtype) says
#: safetensors' float dtypes as numpy reads them (numpy has no bfloat16: its bits, the top half of a float32's)
NUMPY_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16}


class LowRankDelta(NamedTuple):
    """dW = left @ right.T in the description's orientation: left n x r, right m x r (float64)."""

    left: torch.Tensor
    right: torch.Tensor


class QuantizationWarning(UserWarning):
    """The weights are quantized: what is measured of them includes the quantization noise."""


class Stored(NamedTuple):
    """Where one tensor of a safetensors file lies: its file, absolute byte offset and length, dtype and shape,
    for readers that need no tensor library (the rank study on the CPU) or read bytes themselves (a GPU's)."""

    file: Path
    offset: int
    nbytes: int
    dtype: str  # safetensors' name: F64, F32, F16 or BF16
    shape: tuple[int, ...]


def float64_of(raw: np.ndarray, dtype: str) -> np.ndarray:
    """The exact float64 upcast of a tensor's stored values (``raw`` as :data:`NUMPY_DTYPES` reads ``dtype``)."""
    if dtype == "BF16":  # a bfloat16's bits are the top half of a float32's
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw.astype(np.float64)


class Checkpoint(PlannedReads):
    """A lazily read checkpoint. ``name`` is how errors and the store refer to it.

    ``factored`` says the checkpoint stores deltas as thin factors (a LoRA adapter): then
    :meth:`low_rank_deltas` gives them and no base matrix needs to be subtracted.
    """

    factored = False
    #: How it was fetched, where a run should say so once (a Hub model downloaded whole, and why), else None.
    note: str | None = None

    def __init__(self, path: str | os.PathLike[str], name: str | None = None) -> None:
        self.path = Path(path)
        self.name = name or str(path)
        self._index_name: str | None = None
        if not exists(self.path):
            raise CheckpointError(self.name, f"no such file or folder: {self.path}")
        self.folder = self.path if self.path.is_dir() else self.path.parent
        self.files, self._key_file = self._locate_weights()
        self.config = self._read_config()
        self.fetched = self._read_partial()
        self._handles: dict[Path, Any] = {}
        self._file_names: dict[Path, frozenset[str]] = {}
        self._headers: dict[Path, dict[str, Any]] = {}  # safetensors headers, parsed once
        self._data_starts: dict[Path, int] = {}  # where each safetensors file's data begins
        self._maps: dict[Path, mmap.mmap] = {}  # safetensors files mapped for numpy reads
        self._layout: Layout | None = None
        #: What the stages above work out from the shapes alone (a representation's plans), once: they never change
        self.from_shapes: dict[Any, Any] = {}

    # --- discovery of files -------------------------------------------------------------------
    def _locate_weights(self) -> tuple[list[Path], dict[str, Path] | None]:
        """The weight files, and for sharded checkpoints which file holds which tensor (:func:`.locate_weights`)."""
        files, key_file, self._index_name = locate_weights(self.path, self.name)
        return files, key_file

    def _read_config(self) -> dict[str, Any] | None:
        config = self.folder / "config.json"
        return read_json(config, self.name) if exists(config) else None

    # --- tensors -------------------------------------------------------------------------------
    def _open(self, file: Path) -> Any:
        """An open handle: a safetensors ``safe_open`` (memory-mapped: its tensors are views of the file's
        pages, not copies) or a memory-mapped ``.bin`` state dict."""
        handle = self._handles.get(file)
        if handle is None:
            safetensors = file.suffix == ".safetensors"
            if safetensors:
                self._header(file)  # checked first, for the cause in words
            try:
                handle = safe_open(str(file), framework="pt") if safetensors else load_bin(file)
            except Exception as exc:  # safetensors and torch raise many types for a bad file
                raise_if_resource(exc, self.name)  # "Cannot allocate memory" is the machine, not the file
                cause = (None if safetensors else bin_cause(exc)) or _short(exc)
                raise CheckpointError(self.name, f"cannot read {file.name}: {cause}") from None
            self._handles[file] = handle
        return handle

    def keys(self) -> set[str]:
        """Every tensor name in the checkpoint."""
        if self._key_file is not None:
            return set(self._key_file)
        return set().union(*(self._names(file) for file in self.files))

    def _file_of(self, key: str) -> Path:
        if self._key_file is not None:
            if key not in self._key_file:
                raise CheckpointError(self.name, f"missing tensor {key}")
            file = self._key_file[key]
            if key not in self._names(file):
                raise CheckpointError(
                    self.name, f"{shown(file.name)} lacks tensor {shown(key)}, which {self._index_name} puts there"
                )
            return file
        for file in self.files:
            if key in self._names(file):
                return file
        raise CheckpointError(self.name, f"missing tensor {key}")

    def _names(self, file: Path) -> frozenset[str]:
        names = self._file_names.get(file)
        if names is None:
            header = self._header(file)
            names = frozenset(header) if header is not None else frozenset(self._open(file).keys())
            self._file_names[file] = names
        return names

    def _header(self, file: Path) -> dict[str, Any] | None:
        """A safetensors file's parsed header (names, dtypes, shapes: no tensor library needed), checked as
        :meth:`_open` checks it; None for a ``.bin``."""
        if file.suffix != ".safetensors":
            return None
        cached = self._headers.get(file)
        if cached is None:
            try:
                self._data_starts[file], cached = header_of(file)
            except HeaderFault as fault:
                raise CheckpointError(self.name, f"cannot read {file.name}: {fault}") from None
            self._headers[file] = cached
        return cached

    def take_headers(self, headers: Mapping[str, tuple[int, dict[str, Any]]]) -> None:
        """Headers parsed where their bytes came from, by file name (where each file's data starts, its parsed
        header): a partial download's, fetched from the Hub and written verbatim into its files, are not parsed
        again from them."""
        for name, (start, header) in headers.items():
            file = self.folder / name
            if file in self.files:
                self._data_starts[file] = start
                self._headers[file] = {k: v for k, v in header.items() if k != "__metadata__"}

    def stored(self, key: str) -> Stored | None:
        """Where tensor ``key`` lies, to be read whole (a partial download must hold it); None where its file
        is not safetensors (a ``.bin``: read through torch). Checked as :meth:`get_stored` checks: a float tensor."""
        file = self._file_of(key)
        header = self._header(file)
        if header is None:
            return None
        entry = header[key]
        shape = tuple(int(n) for n in entry["shape"])
        if self.fetched is not None:
            self.require_rows({key: [(0, shape[0] if shape else 1)]})
        if entry["dtype"] not in NUMPY_DTYPES:
            raise CheckpointError(
                self.name,
                f"tensor {shown(key)} has dtype {entry['dtype']}, expected float32, float16, bfloat16 or float64",
            )
        begin, end = entry["data_offsets"]
        return Stored(file, self._data_starts[file] + begin, end - begin, entry["dtype"], shape)

    def float64(self, key: str) -> np.ndarray | None:
        """Tensor ``key``'s exact float64 upcast (C order, as stored) from the mapped file, with numpy alone; None
        where its file is not safetensors. What the rank study reads on the CPU: it needs no torch."""
        where = self.stored(key)
        if where is None:
            return None
        pages = self._maps.get(where.file)
        if pages is None:
            with open(where.file, "rb") as fh:
                pages = self._maps[where.file] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        dtype = NUMPY_DTYPES[where.dtype]
        count = where.nbytes // np.dtype(dtype).itemsize
        raw = np.frombuffer(pages, dtype=dtype, count=count, offset=where.offset).reshape(where.shape)
        return float64_of(raw, where.dtype)

    def quantized_types(self) -> list[str]:
        """The quantized tensor types the weights hold (a GGUF's Q4_K, a GPTQ's "GPTQ 4-bit g128"...): none for float
        safetensors and ``.bin``."""
        return []

    def shape(self, key: str) -> tuple[int, ...]:
        file = self._file_of(key)
        header = self._header(file)
        if header is not None and isinstance(header.get(key), dict) and isinstance(header[key].get("shape"), list):
            return tuple(int(n) for n in header[key]["shape"])
        handle = self._open(file)
        if isinstance(handle, dict):
            return tuple(handle[key].shape)
        try:
            return tuple(handle.get_slice(key).get_shape())
        except Exception as exc:
            raise_if_resource(exc, self.name)
            raise CheckpointError(self.name, f"cannot read the shape of tensor {shown(key)}: {_short(exc)}") from None

    def find(self, name: str) -> str | None:
        """The stored key that is ``name`` or ends in ``.`` + ``name`` (task-head or PEFT prefixes), if any."""
        keys = self.keys()
        if name in keys:
            return name
        return min((k for k in keys if k.endswith("." + name)), key=len, default=None)

    def get(self, key: str) -> torch.Tensor:
        """One tensor as float32 (fp16/bf16 are upcast: all computation is float32)."""
        import torch

        return self.get_stored(key).to(torch.float32)

    def get_stored(self, key: str, *, whole: bool = True) -> torch.Tensor:
        """One tensor in its stored dtype (float32, float16, bfloat16 or float64): a view of the mapped
        file (safetensors and ``.bin`` alike), so converting is left to whoever reads it, chunk by chunk,
        and the pages it touches are the page cache's, not the process's anonymous memory.

        In a partial download, ``whole=False`` is a promise to read only rows that
        :meth:`require_rows` checked; otherwise the whole tensor must have been fetched."""
        if whole and self.fetched is not None:
            shape = self.shape(key)
            self.require_rows({key: [(0, int(shape[0]) if shape else 1)]})
        handle = self._open(self._file_of(key))
        try:
            tensor = handle[key] if isinstance(handle, dict) else handle.get_tensor(key)
        except Exception as exc:
            raise_if_resource(exc, self.name)
            raise CheckpointError(self.name, f"cannot read tensor {shown(key)}: {_short(exc)}") from None
        if str(tensor.dtype) not in _FLOAT_DTYPES:
            dtype = str(tensor.dtype).removeprefix("torch.")
            expected = "float32, float16, bfloat16 or float64"
            raise CheckpointError(self.name, f"tensor {shown(key)} has dtype {dtype}, expected {expected}")
        return tensor

    # --- architecture ---------------------------------------------------------------------------
    def architecture(self) -> Architecture:
        return detect(self.config, self.name, None if self.config else self.keys())

    def layout(self) -> Layout:
        """Where each matrix of the representation lives in this checkpoint (prefix resolved); worked out once."""
        if self._layout is None:
            self._layout = self._resolve_layout()
        return self._layout

    def _resolve_layout(self) -> Layout:
        arch = self.architecture()
        config = self.config if self.config else infer_config(arch, self.keys())
        return resolve_layout(arch, config, self.keys(), self.name)

    def matrix_shape(self, ref: MatrixRef, prefix: str) -> tuple[int, int]:
        """The matrix's shape n x m in the description's orientation, fused parts split, from the header alone.

        Raises the one-line errors :meth:`matrix` would: not a matrix, or fused parts that do not divide it."""
        n, (start, stop) = self.columns(ref, prefix)
        return n, stop - start

    def columns(self, ref: MatrixRef, prefix: str) -> tuple[int, tuple[int, int]]:
        """The whole tensor's rows n in the description's orientation, and the columns [start, stop) of it
        that ``ref`` is (a fused part's, or all of them), from the header alone."""
        name = prefix + ref.tensor
        shape = self.shape(name)
        if len(shape) != 2:
            raise CheckpointError(self.name, f"tensor {name} has shape {list(shape)}, expected a matrix")
        n, m = (shape[1], shape[0]) if ref.orientation is Orientation.LINEAR else (shape[0], shape[1])
        return n, self._span(ref, name, (n, m))

    def _span(self, ref: MatrixRef, name: str, whole: tuple[int, int]) -> tuple[int, int]:
        """A fused part's columns [start, stop) of the whole (n x m) matrix, or all of them."""
        if ref.n_parts == 1:
            return 0, whole[1]
        span = ref.span(whole[1])
        if span is None:
            parts = ":".join(map(str, ref.weights)) if ref.weights else str(ref.n_parts)
            raise CheckpointError(
                self.name, f"fused tensor {name} of shape {list(whole)} does not split into parts {parts}"
            )
        return span

    def matrix(
        self, ref: MatrixRef, prefix: str, cache: dict[str, torch.Tensor] | None = None, *, stored: bool = False
    ) -> torch.Tensor:
        """One matrix in the description's orientation W in R^{in x out}, fused parts split.

        float32, or with ``stored`` in the file's dtype (a view of the mapped file where it can be:
        nothing is copied until the caller converts it).
        """
        name = prefix + ref.tensor
        if cache is not None and name in cache:
            whole = cache[name]
        else:
            raw = self.get_stored(name) if stored else self.get(name)
            if raw.ndim != 2:
                raise CheckpointError(self.name, f"tensor {name} has shape {list(raw.shape)}, expected a matrix")
            whole = raw.T if ref.orientation is Orientation.LINEAR else raw
            if cache is not None and ref.n_parts > 1:
                cache[name] = whole
        if ref.n_parts == 1:
            return whole
        start, stop = self._span(ref, name, (int(whole.shape[0]), int(whole.shape[1])))
        return whole[:, start:stop]

    def low_rank_deltas(
        self, base: Layout, shapes: Mapping[tuple[str, int, str], tuple[int, ...]]
    ) -> dict[tuple[str, int, str], LowRankDelta]:
        """The deltas against ``base`` as thin factors; only checkpoints with ``factored`` store them so."""
        raise CheckpointError(self.name, "holds full weights, not low-rank deltas")

    # --- version --------------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """A content hash of the weight files (:func:`.files_fingerprint`), so renamed copies are recognised."""
        return files_fingerprint(self.files)

    def stamp(self) -> str:
        """A cheap stamp of the weight files (:func:`.files_stamp`): a local model's version in the store; a local
        base's version is its :meth:`fingerprint`, remembered by its stamp."""
        return files_stamp(self.files)

    def close(self) -> None:
        """Release the open files now (tensors already read keep their own memory)."""
        for handle in self._handles.values():
            if not isinstance(handle, dict):
                try:
                    handle.__exit__(None, None, None)
                except RuntimeError:  # "Already borrowed": a thread still reads it (a failed model's sketch pool)
                    pass  # released when collected, as before
        self._handles.clear()
        self._file_names.clear()
        for pages in self._maps.values():
            try:
                pages.close()
            except BufferError:  # an array still views it: released when collected
                pass
        self._maps.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def warn_if_quantized(ck: Checkpoint) -> list[str]:
    """Warn (:class:`QuantizationWarning`) when ``ck`` is quantized (a GGUF's types, a GPTQ's...); returns the types
    found."""
    types = ck.quantized_types()
    if types:
        warnings.warn(
            f"{ck.name}: quantized weights ({', '.join(types)}): the ranks are those of the dequantized weights; "
            "quantization noise raises the measured rank, most at thresholds near 1 (4- and 5-bit types "
            "can also lower it slightly where the spectrum decays slowly)",
            QuantizationWarning,
            stacklevel=3,
        )
    return types


def refuse_quantized_delta(ck: Checkpoint) -> None:
    """A one-line error for a delta with a quantized side: its quantization noise would swamp the delta."""
    types = ck.quantized_types()
    if types:
        raise CheckpointError(
            ck.name,
            f"quantized weights ({', '.join(types)}): --of delta needs unquantized weights, "
            "quantization noise is as large as a fine-tuning delta (use an F32/F16/BF16 "
            "GGUF or the original weights)",
        )
