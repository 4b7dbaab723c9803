"""The files that make a model on disk and on the Hub: shared knowledge of the reader and the fetcher.

The reader (:mod:`modelvec.read`) opens these names; the Hub stage (:mod:`modelvec.hub`) downloads
exactly them and nothing else. Both take the names from here, so neither imports the other.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS = "model.safetensors"
BIN_INDEX = "pytorch_model.bin.index.json"
BIN = "pytorch_model.bin"
CONFIG = "config.json"
ADAPTER_CONFIG = "adapter_config.json"
#: A quantizer's own config beside config.json (auto-gptq's, autoawq's): copied with it where a repository has one.
QUANT_CONFIGS = ("quantize_config.json", "quant_config.json")
#: Beside the weight files of a partial download (a few byte ranges of each file fetched, the rest a sparse
#: hole): ``{"files": {file name: [[start, stop], ...]}}``, the byte ranges that are there.
PARTIAL = ".modelvec-partial.json"
#: Adapter weight files in order of preference.
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")

#: Weight formats in order of preference: (format name, the file that announces it).
WEIGHT_FORMATS: tuple[tuple[str, str], ...] = (
    ("safetensors-sharded", SAFETENSORS_INDEX),
    ("safetensors", SAFETENSORS),
    ("bin-sharded", BIN_INDEX),
    ("bin", BIN),
)
#: Other formats a repository may hold, recorded in the catalogue but never downloaded for embedding.
OTHER_FORMATS: tuple[tuple[str, str], ...] = (
    ("tf", "tf_model.h5"),
    ("flax", "flax_model.msgpack"),
    ("onnx", "*.onnx"),
    ("gguf", "*.gguf"),
    ("adapter", ADAPTER_CONFIG),
)
#: The suffix every shard of a sharded format must have (an index may not pull in other files).
SHARD_SUFFIX = {"safetensors-sharded": ".safetensors", "bin-sharded": ".bin"}


def formats(files: Iterable[str]) -> tuple[str, ...]:
    """The weight formats a repository's top-level files offer, best first."""
    names = {f for f in files if "/" not in f}
    found = [fmt for fmt, marker in WEIGHT_FORMATS if marker in names]
    for fmt, marker in OTHER_FORMATS:
        if any(PurePosixPath(n).match(marker) for n in names):
            found.append(fmt)
    return tuple(found)


def weight_format(files: Iterable[str]) -> str | None:
    """The format modelvec reads for this repository, or None when it has no PyTorch weights."""
    usable = [f for f in formats(files) if f in dict(WEIGHT_FORMATS)]
    return usable[0] if usable else None


def adapter_files(files: Iterable[str]) -> list[str] | None:
    """The files of a repository an adapter's vector needs (config, then weights, safetensors first), or None."""
    names = {f for f in files if "/" not in f}
    weights = next((w for w in ADAPTER_WEIGHTS if w in names), None)
    return [ADAPTER_CONFIG, weights] if ADAPTER_CONFIG in names and weights else None


def is_adapter(path: str | Path) -> bool:
    """A folder holding a PEFT adapter and no full weights (when both are there, the full weights are the model)."""
    folder = Path(path)
    try:
        return (folder / ADAPTER_CONFIG).is_file() and not any(
            (folder / name).exists() for name in (SAFETENSORS, SAFETENSORS_INDEX, BIN, BIN_INDEX)
        )
    except (OSError, ValueError):
        return False


def is_gguf(path: str | Path) -> bool:
    """A ``.gguf`` file (by name; the content is checked on opening)."""
    return str(path).lower().endswith(".gguf")


def oldest_time(files: Iterable[Path]) -> str | None:
    """When a local model was made, as far as its files say: their oldest modification time (ISO, UTC, to the
    second); None where one cannot be read."""
    from datetime import UTC, datetime

    try:
        oldest = min(f.stat().st_mtime for f in files)
    except (OSError, ValueError):
        return None
    return datetime.fromtimestamp(oldest, UTC).isoformat(timespec="seconds")


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` of ``fd``: the one positional writer (the store's vector file, a partial
    download's byte ranges). ``pwrite`` may write less than asked (a disk that fills up mid-write takes what fits and
    says so only in its count): the rest is written again, and then the disk's error raises."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        written = os.pwrite(fd, view[done:], offset + done)
        if written <= 0:  # no progress and no error: never loop for ever
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        done += written
