"""Checkpoint reading: only the tensors asked for, lazily, never building a ``transformers`` model.

A checkpoint is a local folder (config.json + weights) or a single weights file. Formats:
``model.safetensors``, sharded safetensors with ``model.safetensors.index.json``,
``pytorch_model.bin`` and sharded ``.bin`` with ``pytorch_model.bin.index.json``. safetensors are
memory-mapped and read as zero-copy views in their stored dtype; ``.bin`` files go through
``torch.load(..., weights_only=True, mmap=True)``, which refuses to run pickled code.
"""

from __future__ import annotations

import json
import mmap
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import xxhash
from safetensors import safe_open

from ..core.errors import CheckpointError, IncompatibleError, raise_if_resource, shown
from ..core.files import BIN, BIN_INDEX, PARTIAL, SAFETENSORS, SAFETENSORS_INDEX
from ..core.spans import merge
from .architectures import Architecture, MatrixRef, Orientation, detect
from .headers import HeaderFault, header_of, row_bytes
from .headers import short_cause as _short

if TYPE_CHECKING:  # torch is imported where tensors are read: opening a checkpoint and reading its shapes needs none
    import torch

_HEAD_BYTES = 1 << 20  # enough for the header of any safetensors file of the supported families
_FLOAT_DTYPES = ("torch.float32", "torch.float16", "torch.bfloat16", "torch.float64")  # as str(dtype) says
#: safetensors' float dtypes as numpy reads them (numpy has no bfloat16: its bits, the top half of a float32's)
NUMPY_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16}


_MAX_JSON = 100_000_000  # config.json and index files: thousands of times any real one

# Causes that torch.load words at length (or as a bare exception type), said in a few words.
_BIN_CAUSES = (
    ("Weights only load failed", "it holds pickled objects other than tensors (refused: weights_only), or is corrupt"),
    ("failed finding central directory", "truncated or corrupt (its zip directory is missing)"),
    ("not a ZIP archive", "not a PyTorch archive (truncated or corrupt)"),
    ("OSError: [Errno 22]", "truncated or corrupt (its zip records point past the end)"),
    ("unexpected EOF", "truncated (the data ends early)"),
    ("EOFError", "truncated (the data ends early)"),
    ("ValueError: not a state dict", "it does not hold a state dict"),
)


def _exists(path: Path) -> bool:
    """Whether something is at ``path``; a name the OS refuses (too long, a NUL byte) names nothing."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def read_json(path: Path, model: str) -> dict[str, Any]:
    try:
        size = path.stat().st_size
        if size > _MAX_JSON:
            raise CheckpointError(model, f"{path.name} is {size:,} bytes, too large for a checkpoint's JSON")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValueError: bad JSON, or an integer of 4,300+ digits
        raise_if_resource(exc, model)
        raise CheckpointError(model, f"{path.name} is not valid JSON ({_short(exc)})") from None
    except RecursionError:
        raise CheckpointError(model, f"{path.name} is not valid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise CheckpointError(model, f"{path.name} is not a JSON object")
    return data


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


class Checkpoint:
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
        if not _exists(self.path):
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

    # --- discovery of files -------------------------------------------------------------------
    def _locate_weights(self) -> tuple[list[Path], dict[str, Path] | None]:
        """The weight files, and for sharded checkpoints which file holds which tensor."""
        if self.path.is_file():
            if self.path.suffix not in (".safetensors", ".bin", ".pt", ".pth"):
                raise CheckpointError(
                    self.name, f"unsupported weights file {self.path.name} (want .safetensors or .bin)"
                )
            return [self.path], None
        for index_name in (SAFETENSORS_INDEX, BIN_INDEX):
            index = self.path / index_name
            if _exists(index):
                self._index_name = index_name
                key_file = self._weight_map(index)
                files = sorted(set(key_file.values()))
                missing = [f.name for f in files if not _exists(f)]
                if missing:
                    raise CheckpointError(self.name, f"{index_name} names missing shard {shown(missing[0])}")
                return self._regular(files), key_file
        for single in (SAFETENSORS, BIN):
            if _exists(self.path / single):
                return self._regular([self.path / single]), None
        raise CheckpointError(
            self.name, f"no weights found in {self.path} (looked for {SAFETENSORS}, {BIN} and their index files)"
        )

    def _weight_map(self, index: Path) -> dict[str, Path]:
        """Which shard holds each tensor, from an index file; a shard must be a plain file name next to it."""
        weight_map = read_json(index, self.name).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            what = "no weight_map" if weight_map is None else "a weight_map that is empty or not a map"
            raise CheckpointError(self.name, f"{index.name} has {what}")
        key_file = {}
        for key, shard in weight_map.items():
            if not isinstance(shard, str):
                raise CheckpointError(self.name, f"{index.name} maps {shown(key)} to {shown(shard)}, not a file name")
            # Checked lexically: the Hub cache's files are symlinks into a blobs folder, so
            # resolving them would leave the folder.
            if shard in ("", ".", "..") or Path(shard).name != shard or any(c in shard for c in "\\\0"):
                raise CheckpointError(self.name, f"{index.name} points outside the folder: {shown(shard)}")
            key_file[key] = self.path / shard
        return key_file

    def _regular(self, files: list[Path]) -> list[Path]:
        """Weight files must be regular files: a folder, device or FIFO (which would block a read) is refused."""
        for file in files:
            if not file.is_file():
                raise CheckpointError(self.name, f"{shown(file.name)} is not a regular file")
        return files

    def _read_partial(self) -> dict[Path, list[tuple[int, int]]] | None:
        """The byte ranges held of each weight file where they are a partial download (None: whole files)."""
        marker = self.folder / PARTIAL
        if not _exists(marker):
            return None
        files = read_json(marker, self.name).get("files")
        if not isinstance(files, dict):
            raise CheckpointError(self.name, f"{PARTIAL} lists no files")
        return {self.folder / name: sorted((int(a), int(b)) for a, b in ranges) for name, ranges in files.items()}

    def _read_config(self) -> dict[str, Any] | None:
        config = self.folder / "config.json"
        return read_json(config, self.name) if _exists(config) else None

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
                handle = safe_open(str(file), framework="pt") if safetensors else _load_bin(file)
            except Exception as exc:  # safetensors and torch raise many types for a bad file
                raise_if_resource(exc, self.name)  # "Cannot allocate memory" is the machine, not the file
                cause = (None if safetensors else _bin_cause(exc)) or _short(exc)
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
        """The quantized tensor types the weights hold (a GGUF's Q4_K, ...): none for safetensors and ``.bin``."""
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
        config = self.config if self.config else _infer_config(arch, self.keys())
        refs = arch.matrices(config)
        if not refs:
            raise CheckpointError(self.name, "the architecture has no layers to read")
        names = self.keys()
        prefix = next((p for p in arch.prefixes if p + refs[0].tensor in names), None)
        if prefix is None:
            raise CheckpointError(
                self.name,
                f"missing tensor {refs[0].tensor} (also tried prefixes {', '.join(repr(p) for p in arch.prefixes if p)})",
            )
        for ref in refs:
            if prefix + ref.tensor not in names:
                raise CheckpointError(self.name, f"missing tensor {prefix + ref.tensor}")
        return Layout(arch, refs, prefix)

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
        """A content hash of the weight files (xxh3-128, a few GB/s), so renamed copies are recognised."""
        digest = xxhash.xxh3_128()
        for file in self.files:
            digest.update(file.name.encode())
            with open(file, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                digest.update(size.to_bytes(8, "little"))
                if size:
                    with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as view:
                        digest.update(view)
        return digest.hexdigest()

    def stamp(self) -> str:
        """A cheap stamp of the weight files: names, sizes, modification times and headers (a local model's version
        in the store; a local base's version is its :meth:`fingerprint`, remembered by its stamp).

        How make and rsync judge change: it reads no tensor data, so a run over thousands of
        local models spends nothing on recognising the ones already stored (a full content hash
        of a bert-base file costs about what embedding it does). ``fingerprint`` hashes content.
        """
        digest = xxhash.xxh3_128()
        for file in self.files:
            stat = file.stat()
            digest.update(f"{file.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
            with open(file, "rb") as fh:
                digest.update(fh.read(_HEAD_BYTES))  # a safetensors header: every name, dtype, shape and offset
        return "stat:" + digest.hexdigest()

    def byte_ranges(self, rows: Mapping[str, Sequence[tuple[int, int]]]) -> dict[Path, list[tuple[int, int]]] | None:
        """Where the given stored rows of each tensor lie: byte ranges [start, stop) per weight file, sorted
        and merged where they touch. None when a file is not safetensors (a pickled ``.bin`` has no
        byte layout to read it by)."""
        out: dict[Path, list[tuple[int, int]]] = {}
        for key, ranges in rows.items():
            file = self._file_of(key)
            header = self._header(file)  # parsed once per checkpoint, checked sound
            if header is None:
                return None
            start = self._data_starts[file]
            out.setdefault(file, []).extend((start + a, start + b) for a, b in row_bytes(header[key], ranges))
        return {file: merge(spans) for file, spans in out.items()}

    def require_rows(self, rows: Mapping[str, Sequence[tuple[int, int]]]) -> None:
        """Raise unless the given stored rows of each tensor are here: always so for whole files; a partial
        download holds only the rows it was fetched for."""
        if self.fetched is None:
            return
        where = self.byte_ranges(rows)
        for file, spans in (where or {}).items():
            held = self.fetched.get(file, [])
            for a, b in spans:
                if not any(h0 <= a and b <= h1 for h0, h1 in held):
                    key = next(k for k in rows if self._file_of(k) == file)
                    raise CheckpointError(
                        self.name,
                        f"only some rows of {file.name} were fetched (bytes {a:,}-{b:,} of tensor {shown(key)} "
                        "are not): embed it again to fetch what this representation reads",
                    )

    def prefetch(self, rows: Mapping[str, Sequence[tuple[int, int]]] | None = None) -> None:
        """Ask the kernel to read the weight files (or only the byte ranges of the given rows) into the page
        cache now, without waiting for it.

        Called for models queued behind the one being computed, so their reads from disk overlap
        the computation; a no-op for files already cached, and where the OS lacks the call.
        """
        advise = getattr(os, "posix_fadvise", None)
        if advise is None:
            return
        ranges = self.byte_ranges(rows) if rows is not None else None
        for file in self.files:
            fd = os.open(file, os.O_RDONLY)
            try:
                for a, b in ranges.get(file, []) if ranges is not None else [(0, 0)]:
                    advise(fd, a, b - a, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)

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


class Layout:
    """The resolved matrices of one checkpoint: its architecture, matrix refs and name prefix."""

    def __init__(self, arch: Architecture, refs: list[MatrixRef], prefix: str) -> None:
        self.arch = arch
        self.refs = refs
        self.prefix = prefix

    def by_layer(self) -> Iterator[tuple[str, int, list[MatrixRef]]]:
        """Refs grouped by (stack, layer), in order."""
        group: list[MatrixRef] = []
        for ref in self.refs:
            if group and (group[0].stack, group[0].layer) != (ref.stack, ref.layer):
                yield group[0].stack, group[0].layer, group
                group = []
            group.append(ref)
        if group:
            yield group[0].stack, group[0].layer, group


def _load_bin(file: Path) -> dict[str, torch.Tensor]:
    """A ``.bin`` state dict, memory-mapped; ``weights_only=True`` so no pickled code runs."""
    import torch

    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as exc:
        if "mmap" not in str(exc).lower() and "zip" not in str(exc).lower():
            raise
        state = torch.load(file, map_location="cpu", weights_only=True)  # legacy (non-zip) format
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ValueError("not a state dict")
    return {k: v for k, v in state.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}


def _bin_cause(exc: BaseException) -> str | None:
    """A ``.bin`` file's load failure in a few words; a bare I/O error (permissions...) is left as it is.

    A damaged file fails deep inside torch.load's unpickler or zip reader (IndexError, struct.error,
    KeyError, ...), whose own words say little: they are prefixed with what they mean.
    """
    text = f"{type(exc).__name__}: {exc}"
    known = next((cause for needle, cause in _BIN_CAUSES if needle in text), None)
    return known or (None if isinstance(exc, OSError) else f"corrupt or not a PyTorch file ({_short(exc)})")


def _infer_config(arch: Architecture, names: set[str]) -> dict[str, Any]:
    """Layer counts from tensor names, for a bare weights file without config.json."""
    config: dict[str, Any] = {}
    for stack in arch.stacks:
        first = stack.tensors[0]
        count = 0
        while any(p + first.name(count) in names for p in arch.prefixes):
            count += 1
        for key in stack.layers_keys:
            config.setdefault(key, count)
    return config


def check_compatible(model: Checkpoint, model_layout: Layout, base_layout: Layout) -> None:
    """A fine-tune must have its base's family and matrices; raises a one-line error otherwise."""
    if model_layout.arch is not base_layout.arch:
        raise IncompatibleError(
            model.name, f"family {model_layout.arch.name} does not match the base's family {base_layout.arch.name}"
        )
    if [r.key for r in model_layout.refs] != [r.key for r in base_layout.refs]:
        n_model = max(r.layer for r in model_layout.refs) + 1
        n_base = max(r.layer for r in base_layout.refs) + 1
        raise IncompatibleError(
            model.name, f"has {n_model} layers / matrices that differ from the base's ({n_base} layers)"
        )


def warn_if_quantized(ck: Checkpoint) -> list[str]:
    """Warn (:class:`QuantizationWarning`) when ``ck`` is quantized (a GGUF's types); returns the types found."""
    types = ck.quantized_types()
    if types:
        warnings.warn(
            f"{ck.name}: quantized GGUF ({', '.join(types)}): the ranks are those of the dequantized weights; "
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
            f"quantized GGUF ({', '.join(types)}): --of delta needs unquantized weights, "
            "quantization noise is as large as a fine-tuning delta (use an F32/F16/BF16 "
            "GGUF or the original weights)",
        )
