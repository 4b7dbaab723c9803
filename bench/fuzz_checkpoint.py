"""Coverage-guided fuzzing of checkpoint parsing: safetensors headers and index files, with atheris.

Each input is one checkpoint: its first byte picks a single safetensors file (the rest of the
input is the file) or a sharded folder (the rest is its ``model.safetensors.index.json``, beside
two real shards, a config.json and a file one level up). The harness opens it with
:class:`modelvec.Checkpoint` and reads every tensor, as a run would. Allowed outcomes: float32
tensors of the declared shapes, or a ``ModelvecError`` whose message is one printable line starting
with the model's name. For safetensors files, the header check must also agree with
``safe_open`` (accepting exactly what it accepts). Anything else (another exception, a crash, a
hang) is a finding, and libFuzzer writes the input to ``crash-*``.

Run: ``python bench/fuzz_checkpoint.py -runs=20000`` (any libFuzzer flags, then corpus folders;
an empty or absent corpus starts from seeds of valid and edge-case files, written here).
Needs ``pip install atheris`` (Linux, Python < 3.13); it is no part of the test suite.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import atheris
import torch
from safetensors import safe_open
from safetensors.torch import save_file

with atheris.instrument_imports(include=["modelvec.checkpoint"]):
    from modelvec.core.errors import ModelvecError
    from modelvec.read import Checkpoint
    from modelvec.read.headers import safetensors_fault as _safetensors_fault

NAME = "org/fuzzed model"


def _workdir() -> Path:
    """A folder for the inputs, in memory where there is /dev/shm (10x the runs per second of a disk).

    libFuzzer ends the process without running Python's exit handlers, so the folders of earlier
    runs whose process has ended are removed here instead.
    """
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    for old in root.glob("modelvec-fuzz-*"):
        pid = old.name.rsplit("-", 1)[-1]
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(old, ignore_errors=True)
        except (ValueError, PermissionError):
            pass
    work = root / f"modelvec-fuzz-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    return work


WORK = _workdir()
SINGLE = WORK / "single.safetensors"
DICTIONARY = [
    "dtype",
    "shape",
    "data_offsets",
    "__metadata__",
    "weight_map",
    "metadata",
    "F32",
    "F16",
    "BF16",
    "F64",
    "I8",
    "BOOL",
    "F4",
    "F8_E4M3",
    "one.safetensors",
    "two.safetensors",
    "../outside.safetensors",
    "config.json",
    "18446744073709551615",
    "-1",
    "[]",
    "{}",
    "[0,0]",
    "null",
    "1e400",
]
FOLDER = WORK / "sharded"


def _setup() -> list[bytes]:
    """The sharded folder, and seeds: a valid small file, edge cases, and a valid index."""
    FOLDER.mkdir()
    save_file({"a": torch.randn(2, 2), "b": torch.randn(3).half()}, str(FOLDER / "one.safetensors"))
    save_file({"c": torch.randn(1, 4).bfloat16()}, str(FOLDER / "two.safetensors"))
    save_file({"a": torch.randn(2, 2)}, str(WORK / "outside.safetensors"))
    (FOLDER / "config.json").write_text("{}")
    small = WORK / "seed.safetensors"
    save_file(
        {"w": torch.randn(3, 4), "h": torch.randn(5).half(), "s": torch.tensor(1.0, dtype=torch.float64)},
        str(small),
        metadata={"format": "pt"},
    )
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    edge = json.dumps(header).encode()
    index = {"metadata": {}, "weight_map": {"a": "one.safetensors", "b": "one.safetensors", "c": "two.safetensors"}}
    return [
        b"\0" + small.read_bytes(),
        b"\0" + struct.pack("<Q", len(edge)) + edge + bytes(8),
        b"\0" + struct.pack("<Q", 2) + b"{}",
        b"\1" + json.dumps(index).encode(),
        b"\1" + json.dumps({"weight_map": {"a": "../outside.safetensors"}}).encode(),
    ]


def _read_all(path: Path) -> bool:
    """Open and read every tensor; True when read, False for a clean refusal; raises on anything else."""
    try:
        with Checkpoint(path, name=NAME) as ck:
            for key in sorted(ck.keys()):
                shape = ck.shape(key)
                tensor = ck.get(key)
                if tensor.dtype != torch.float32 or tuple(tensor.shape) != shape:
                    raise AssertionError(f"{key}: {tensor.dtype} {tuple(tensor.shape)}, declared {shape}")
            if path.is_dir() and not all(f.parent == FOLDER for f in ck.files):
                raise AssertionError(f"read files outside the folder: {ck.files}")
        return True
    except ModelvecError as err:
        message = str(err)
        if not (message.startswith(NAME + ": ") and message.isprintable() and len(message) < 400):
            raise AssertionError(f"not one short line naming the model: {message!r}") from err
        return False


def _accepted(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="pt"):
            return True
    except Exception:
        return False


def test_one_input(data: bytes) -> None:
    if not data:
        return
    if data[0] % 2 == 0:
        SINGLE.write_bytes(data[1:])
        _read_all(SINGLE)
        if (_safetensors_fault(SINGLE) is None) != _accepted(SINGLE):
            raise AssertionError(f"header check and safe_open disagree: {_safetensors_fault(SINGLE)!r}")
    else:
        (FOLDER / "model.safetensors.index.json").write_bytes(data[1:])
        _read_all(FOLDER)


def main() -> None:
    seeds = _setup()
    argv = list(sys.argv)
    if not any(arg.startswith("-dict=") for arg in argv):  # the words of headers and index files
        words = WORK / "checkpoint.dict"
        words.write_text("".join(f'"{w}"\n' for w in DICTIONARY).replace('""', '"\\""'))
        argv.insert(1, f"-dict={words}")
    paths = [arg for arg in argv[1:] if not arg.startswith("-")]
    if not paths:
        paths.append(str(WORK / "corpus"))
        argv.append(paths[0])
    corpus = Path(paths[0])
    if not corpus.is_file():  # a corpus folder (a file is an input to run again, as for a crash-* file)
        corpus.mkdir(parents=True, exist_ok=True)
        if not any(corpus.iterdir()):  # a new corpus starts from the seeds
            for i, seed in enumerate(seeds):
                (corpus / f"seed-{i}").write_bytes(seed)
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
