"""Checkpoint reading: only the tensors asked for, lazily, never building a ``transformers`` model.

A checkpoint is a local folder (config.json + weights) or a single weights file. Formats:
``model.safetensors``, sharded safetensors with ``model.safetensors.index.json``,
``pytorch_model.bin`` and sharded ``.bin`` with ``pytorch_model.bin.index.json``. safetensors are
opened with ``safe_open`` (memory-mapped, one tensor at a time); ``.bin`` files go through
``torch.load(..., weights_only=True, mmap=True)``, which refuses to run pickled code.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Any, Iterator

import torch
import xxhash
from safetensors import safe_open

from .architectures import Architecture, MatrixRef, Orientation, detect
from .errors import CheckpointError, IncompatibleError

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS = "model.safetensors"
BIN_INDEX = "pytorch_model.bin.index.json"
BIN = "pytorch_model.bin"

_HEAD_BYTES = 1 << 20  # enough for the header of any safetensors file of the supported families
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _read_json(path: Path, model: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(model, f"{path.name} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(model, f"{path.name} is not a JSON object")
    return data


class Checkpoint:
    """A lazily read checkpoint. ``name`` is how errors and the store refer to it."""

    def __init__(self, path: str | os.PathLike[str], name: str | None = None) -> None:
        self.path = Path(path)
        self.name = name or str(path)
        if not self.path.exists():
            raise CheckpointError(self.name, f"no such file or folder: {self.path}")
        self.folder = self.path if self.path.is_dir() else self.path.parent
        self.files, self._key_file = self._locate_weights()
        self.config = self._read_config()
        self._handles: dict[Path, Any] = {}
        self._file_names: dict[Path, frozenset[str]] = {}
        self._layout: Layout | None = None

    # --- discovery of files -------------------------------------------------------------------
    def _locate_weights(self) -> tuple[list[Path], dict[str, Path] | None]:
        """The weight files, and for sharded checkpoints which file holds which tensor."""
        if self.path.is_file():
            if self.path.suffix not in (".safetensors", ".bin", ".pt", ".pth"):
                raise CheckpointError(self.name, f"unsupported weights file {self.path.name} (want .safetensors or .bin)")
            return [self.path], None
        for index_name in (SAFETENSORS_INDEX, BIN_INDEX):
            index = self.path / index_name
            if index.exists():
                weight_map = _read_json(index, self.name).get("weight_map")
                if not isinstance(weight_map, dict) or not weight_map:
                    raise CheckpointError(self.name, f"{index_name} has no weight_map")
                key_file = {}
                for key, shard in weight_map.items():
                    # A plain file name next to the index (checked lexically: the Hub cache's files
                    # are symlinks into a blobs folder, so resolving would leave the folder).
                    if str(shard) in ("", ".", "..") or Path(str(shard)).name != str(shard) or "\\" in str(shard):
                        raise CheckpointError(self.name, f"{index_name} points outside the folder: {shard}")
                    shard_path = self.path / str(shard)
                    key_file[key] = shard_path
                files = sorted(set(key_file.values()))
                missing = [f.name for f in files if not f.exists()]
                if missing:
                    raise CheckpointError(self.name, f"{index_name} names missing shard {missing[0]}")
                return files, key_file
        for single in (SAFETENSORS, BIN):
            if (self.path / single).exists():
                return [self.path / single], None
        raise CheckpointError(self.name, f"no weights found in {self.path} (looked for {SAFETENSORS}, {BIN} and their index files)")

    def _read_config(self) -> dict[str, Any] | None:
        config = self.folder / "config.json"
        return _read_json(config, self.name) if config.exists() else None

    # --- tensors -------------------------------------------------------------------------------
    def _open(self, file: Path) -> Any:
        """An open handle: a safetensors ``safe_open`` or a memory-mapped ``.bin`` state dict."""
        handle = self._handles.get(file)
        if handle is None:
            try:
                if file.suffix == ".safetensors":
                    handle = safe_open(str(file), framework="pt")
                else:
                    handle = _load_bin(file)
            except CheckpointError:
                raise
            except Exception as exc:  # safetensors and torch raise many types for a bad file
                raise CheckpointError(self.name, f"cannot read {file.name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
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
            return self._key_file[key]
        for file in self.files:
            if key in self._names(file):
                return file
        raise CheckpointError(self.name, f"missing tensor {key}")

    def _names(self, file: Path) -> frozenset[str]:
        names = self._file_names.get(file)
        if names is None:
            names = self._file_names[file] = frozenset(self._open(file).keys())
        return names

    def shape(self, key: str) -> tuple[int, ...]:
        handle = self._open(self._file_of(key))
        if isinstance(handle, dict):
            return tuple(handle[key].shape)
        return tuple(handle.get_slice(key).get_shape())

    def get(self, key: str) -> torch.Tensor:
        """One tensor as float32 (fp16/bf16 are upcast: all computation is float32)."""
        handle = self._open(self._file_of(key))
        try:
            tensor = handle[key] if isinstance(handle, dict) else handle.get_tensor(key)
        except Exception as exc:
            raise CheckpointError(self.name, f"cannot read tensor {key}: {exc}") from None
        if tensor.dtype not in _FLOAT_DTYPES:
            raise CheckpointError(self.name, f"tensor {key} has dtype {tensor.dtype}, expected a floating-point type")
        return tensor.to(torch.float32)

    # --- architecture ---------------------------------------------------------------------------
    def architecture(self) -> Architecture:
        return detect(self.config, self.name, None if self.config else self.keys())

    def layout(self) -> "Layout":
        """Where each matrix of the representation lives in this checkpoint (prefix resolved); worked out once."""
        if self._layout is None:
            self._layout = self._resolve_layout()
        return self._layout

    def _resolve_layout(self) -> "Layout":
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

    def matrix(self, ref: MatrixRef, prefix: str, cache: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """One matrix in the description's orientation W in R^{in x out}, fused parts split."""
        name = prefix + ref.tensor
        if cache is not None and name in cache:
            whole = cache[name]
        else:
            raw = self.get(name)
            if raw.ndim != 2:
                raise CheckpointError(self.name, f"tensor {name} has shape {list(raw.shape)}, expected a matrix")
            whole = raw.T if ref.orientation is Orientation.LINEAR else raw
            if cache is not None and ref.n_parts > 1:
                cache[name] = whole
        if ref.n_parts == 1:
            return whole
        out = whole.shape[1]
        if out % ref.n_parts:
            raise CheckpointError(self.name, f"fused tensor {name} of shape {list(whole.shape)} does not split into {ref.n_parts} parts")
        width = out // ref.n_parts
        return whole[:, ref.part * width : (ref.part + 1) * width]

    # --- identity -------------------------------------------------------------------------------
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

    def identity(self) -> str:
        """A cheap identity of the weight files: names, sizes, modification times and headers.

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

    def prefetch(self) -> None:
        """Ask the kernel to read the weight files into the page cache now, without waiting for it.

        Called for models queued behind the one being computed, so their reads from disk overlap
        the computation; a no-op for files already cached, and where the OS lacks the call.
        """
        advise = getattr(os, "posix_fadvise", None)
        for file in self.files if advise is not None else ():
            fd = os.open(file, os.O_RDONLY)
            try:
                advise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)

    def close(self) -> None:
        self._handles.clear()
        self._file_names.clear()

    def __enter__(self) -> "Checkpoint":
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
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as exc:
        if "mmap" not in str(exc).lower() and "zip" not in str(exc).lower():
            raise
        state = torch.load(file, map_location="cpu", weights_only=True)  # legacy (non-zip) format
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise CheckpointError(str(file), "the .bin file does not hold a state dict")
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


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
        raise IncompatibleError(model.name, f"has {n_model} layers / matrices that differ from the base's ({n_base} layers)")
