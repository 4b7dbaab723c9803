"""A checkpoint's files on disk: its weight files (and the index that names its shards) found and checked, its JSON
files read with bounds, a pickled ``.bin`` loaded without running pickled code."""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

from ..core.errors import CheckpointError, raise_if_resource, shown
from ..core.files import BIN, BIN_INDEX, SAFETENSORS, SAFETENSORS_INDEX
from .headers import short_cause as _short

if TYPE_CHECKING:
    import torch

_HEAD_BYTES = 1 << 20  # enough for the header of any safetensors file of the supported families
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


def exists(path: Path) -> bool:
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


def locate_weights(path: Path, name: str) -> tuple[list[Path], dict[str, Path] | None, str | None]:
    """The weight files of a checkpoint at ``path``, for sharded checkpoints which file holds which tensor, and the
    index that says so (None: one file)."""
    if path.is_file():
        if path.suffix not in (".safetensors", ".bin", ".pt", ".pth"):
            raise CheckpointError(name, f"unsupported weights file {path.name} (want .safetensors or .bin)")
        return [path], None, None
    for index_name in (SAFETENSORS_INDEX, BIN_INDEX):
        index = path / index_name
        if exists(index):
            key_file = _weight_map(index, name)
            files = sorted(set(key_file.values()))
            missing = [f.name for f in files if not exists(f)]
            if missing:
                raise CheckpointError(name, f"{index_name} names missing shard {shown(missing[0])}")
            return _regular(files, name), key_file, index_name
    for single in (SAFETENSORS, BIN):
        if exists(path / single):
            return _regular([path / single], name), None, None
    raise CheckpointError(name, f"no weights found in {path} (looked for {SAFETENSORS}, {BIN} and their index files)")


def _weight_map(index: Path, name: str) -> dict[str, Path]:
    """Which shard holds each tensor, from an index file; a shard must be a plain file name next to it."""
    weight_map = read_json(index, name).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        what = "no weight_map" if weight_map is None else "a weight_map that is empty or not a map"
        raise CheckpointError(name, f"{index.name} has {what}")
    key_file = {}
    for key, shard in weight_map.items():
        if not isinstance(shard, str):
            raise CheckpointError(name, f"{index.name} maps {shown(key)} to {shown(shard)}, not a file name")
        # Checked lexically: the Hub cache's files are symlinks into a blobs folder, so
        # resolving them would leave the folder.
        if shard in ("", ".", "..") or Path(shard).name != shard or any(c in shard for c in "\\\0"):
            raise CheckpointError(name, f"{index.name} points outside the folder: {shown(shard)}")
        key_file[key] = index.parent / shard
    return key_file


def _regular(files: list[Path], name: str) -> list[Path]:
    """Weight files must be regular files: a folder, device or FIFO (which would block a read) is refused."""
    for file in files:
        if not file.is_file():
            raise CheckpointError(name, f"{shown(file.name)} is not a regular file")
    return files


def load_bin(file: Path) -> dict[str, torch.Tensor]:
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


def bin_cause(exc: BaseException) -> str | None:
    """A ``.bin`` file's load failure in a few words; a bare I/O error (permissions...) is left as it is.

    A damaged file fails deep inside torch.load's unpickler or zip reader (IndexError, struct.error,
    KeyError, ...), whose own words say little: they are prefixed with what they mean.
    """
    text = f"{type(exc).__name__}: {exc}"
    known = next((cause for needle, cause in _BIN_CAUSES if needle in text), None)
    return known or (None if isinstance(exc, OSError) else f"corrupt or not a PyTorch file ({_short(exc)})")


def files_fingerprint(files: list[Path]) -> str:
    """A content hash of weight files (xxh3-128, a few GB/s), so renamed copies are recognised."""
    digest = xxhash.xxh3_128()
    for file in files:
        digest.update(file.name.encode())
        with open(file, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            digest.update(size.to_bytes(8, "little"))
            if size:
                with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as view:
                    digest.update(view)
    return digest.hexdigest()


def files_stamp(files: list[Path]) -> str:
    """A cheap stamp of weight files: names, sizes, modification times and headers.

    How make and rsync judge change: it reads no tensor data, so a run over thousands of
    local models spends nothing on recognising the ones already stored (a full content hash
    of a bert-base file costs about what embedding it does). :func:`files_fingerprint` hashes content.
    """
    digest = xxhash.xxh3_128()
    for file in files:
        stat = file.stat()
        digest.update(f"{file.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
        with open(file, "rb") as fh:
            digest.update(fh.read(_HEAD_BYTES))  # a safetensors header: every name, dtype, shape and offset
    return "stat:" + digest.hexdigest()
