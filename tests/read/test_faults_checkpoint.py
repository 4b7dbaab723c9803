"""Broken and hostile checkpoints never crash a run: each gives one line naming the model and the cause.

Truncations, corrupt safetensors headers, index files that lie or point outside the folder, and
weights of the wrong dtype or shape, through the public paths a run takes (``embed_one`` and
``modelvec.embed``); then property-based tests that feed random bytes, headers and index files to
:class:`Checkpoint` and accept only float32 tensors of the declared shape or a ``CheckpointError``.
"""

from __future__ import annotations

import gc
import json
import math
import os
import resource
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import modelvec
from builders import save_state
from modelvec import Checkpoint, CheckpointError, DeltaEmbedder, ModelvecError, Store
from modelvec.read.headers import _DTYPE_BITS
from modelvec.read.headers import safetensors_fault as _safetensors_fault

NAME = "org/broken model"  # how the checkpoints under test are named: every message must start with it


def assert_one_line(err: BaseException, name: str, *needles: str) -> str:
    assert isinstance(err, ModelvecError), f"{type(err).__name__}: {err}"
    return check_message(str(err), name, *needles)


def check_message(message: str, name: str, *needles: str) -> str:
    """One short printable line: the model's name, then the cause holding each of ``needles``."""
    assert message.startswith(f"{name}: "), message
    assert message.isprintable() and len(message) < 400, message  # no newline, no control character
    for needle in needles:
        assert needle in message, message
    return message


def safetensors_bytes(header: object, data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file: a header (a JSON value, or raw bytes) and data; ``length`` overrides the header's length."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def with_weights(src: Path, out: Path, raw: bytes) -> Path:
    """A copy of the checkpoint folder ``src`` whose model.safetensors is ``raw``."""
    out.mkdir(parents=True)
    shutil.copy(src / "config.json", out)
    (out / "model.safetensors").write_bytes(raw)
    return out


@pytest.fixture(scope="module")
def embedder(tiny_bert) -> DeltaEmbedder:
    return DeltaEmbedder(rank=4).fit(tiny_bert)


def expect_error(embedder: DeltaEmbedder, folder: Path, *needles: str) -> str:
    """Embedding the model the way a run does fails with one line naming it and the cause."""
    with pytest.raises(ModelvecError) as err:
        embedder.embed_one(Checkpoint(folder, name=NAME))
    return assert_one_line(err.value, NAME, *needles)


# --- truncated files ----------------------------------------------------------------------------


def _cuts(size: int, header: int) -> dict[str, int]:
    return {
        "empty": 0,
        "inside-length": 3,
        "length-only": 8,
        "inside-header": 8 + header // 2,
        "after-header": 8 + header,
        "mid-data": (8 + header + size) // 2,
        "one-byte-short": size - 1,
    }


CUTS = list(_cuts(100, 10))


@pytest.mark.parametrize("where", CUTS)
def test_truncated_safetensors(embedder, tiny_finetunes, tmp_path, where):
    raw = (tiny_finetunes[0] / "model.safetensors").read_bytes()
    cut = _cuts(len(raw), int.from_bytes(raw[:8], "little"))[where]
    folder = with_weights(tiny_finetunes[0], tmp_path / "cut", raw[:cut])
    message = expect_error(embedder, folder, "model.safetensors", "truncated")
    with pytest.raises(Exception):  # safetensors agrees that the file is broken
        safe_open(str(folder / "model.safetensors"), framework="pt")
    assert "Error while" not in message and "os error" not in message


@pytest.mark.parametrize("where", ["empty", "inside-zip", "half", "one-byte-short"])
def test_truncated_bin(embedder, tiny_finetunes, tmp_path, where):
    full = tmp_path / "full.bin"
    torch.save(load_file(str(tiny_finetunes[0] / "model.safetensors")), full)
    raw = full.read_bytes()
    cut = {"empty": 0, "inside-zip": 10, "half": len(raw) // 2, "one-byte-short": len(raw) - 1}[where]
    folder = tmp_path / "bin"
    folder.mkdir()
    shutil.copy(tiny_finetunes[0] / "config.json", folder)
    (folder / "pytorch_model.bin").write_bytes(raw[:cut])
    message = expect_error(embedder, folder, "pytorch_model.bin")
    assert "truncated" in message or "corrupt" in message


def test_bin_without_a_state_dict_names_the_model(tmp_path):
    """A .bin holding a list was reported under its file's path rather than the model's name."""
    folder = tmp_path / "list"
    folder.mkdir()
    torch.save([torch.zeros(2)], folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as err:
        Checkpoint(folder, name=NAME).keys()
    assert_one_line(err.value, NAME, "pytorch_model.bin", "does not hold a state dict")


# --- corrupt headers ----------------------------------------------------------------------------

A = {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
B = {"dtype": "F32", "shape": [4], "data_offsets": [24, 40]}
DATA = bytes(40)

HEADERS = {
    # id: (header, data, header length override, words the message must hold)
    "bad-json": (b"{nope", DATA, None, ["header is not valid JSON"]),
    "not-an-object": ([1, 2], DATA, None, ["header is not a JSON object"]),
    "not-utf8": (b'{"\xff": 1}', DATA, None, ["header is not UTF-8"]),
    "nested-deeply": (b"[" * 100_000 + b"]" * 100_000, DATA, None, ["nested too deeply"]),
    "entry-not-an-object": ({"a": 5}, DATA, None, ["tensor a is 5"]),
    "entry-without-dtype": ({"a": {"shape": [1], "data_offsets": [0, 4]}}, bytes(4), None, ["tensor a has no dtype"]),
    "offsets-out-of-range": (
        {"a": A, "b": {**B, "data_offsets": [1000, 1016]}},
        DATA,
        None,
        ["tensor b", "[1000, 1016]", "past the 40 bytes"],
    ),
    "offsets-overlap": (
        {"a": A, "b": {**B, "data_offsets": [8, 24], "shape": [4]}},
        DATA[:24],
        None,
        ["tensor b overlaps tensor a"],
    ),
    "offsets-gap": ({"a": {**A, "data_offsets": [16, 40]}}, DATA, None, ["bytes 0-16 unused"]),
    "offsets-end-before-begin": ({"a": {**A, "data_offsets": [24, 0]}}, DATA[:24], None, ["begin <= end", "[24, 0]"]),
    "offsets-three": ({"a": {**A, "data_offsets": [0, 24, 24]}}, DATA[:24], None, ["data_offsets are not"]),
    "header-longer-than-file": ({"a": A}, DATA[:24], 1000, ["truncated", "claims 1,000 bytes"]),
    "header-length-2**62": ({"a": A}, DATA[:24], 2**62, ["corrupt", "100 MB limit"]),
    "header-length-200MB": ({"a": A}, DATA[:24], 200_000_000, ["corrupt", "200,000,000 bytes"]),
    "header-length-2**64-1": ({"a": A}, DATA[:24], 2**64 - 1, ["corrupt", "100 MB limit"]),
    "unknown-dtype": ({"a": {**A, "dtype": "F33"}}, DATA[:24], None, ["unknown dtype F33"]),
    "dtype-not-a-string": ({"a": {**A, "dtype": None}}, DATA[:24], None, ["unknown dtype null"]),
    "shape-disagrees-with-bytes": ({"a": {**A, "shape": [3, 3]}}, DATA[:24], None, ["takes 36 bytes", "span 24"]),
    "shape-negative": ({"a": {**A, "shape": [-2, -3]}}, DATA[:24], None, ["non-negative integers", "[-2, -3]"]),
    "shape-non-integer": ({"a": {**A, "shape": [2.0, 3]}}, DATA[:24], None, ["non-negative integers"]),
    "shape-a-string": ({"a": {**A, "shape": "2x3"}}, DATA[:24], None, ["non-negative integers"]),
    "shape-overflows": ({"a": {**A, "shape": [2**40, 2**40]}}, DATA[:24], None, ["too large"]),
    "shape-beyond-u64": ({"a": {**A, "shape": [2**64]}}, DATA[:24], None, ["non-negative integers"]),
    "trailing-bytes": ({"a": A}, DATA, None, ["corrupt", "16 bytes follow"]),
    "metadata-not-strings": ({"__metadata__": {"format": 1}, "a": A}, DATA[:24], None, ["__metadata__"]),
    "name-with-newline": ({"a\nb": {**A, "dtype": "?"}}, DATA[:24], None, ["'a\\nb'", "unknown dtype"]),
    "name-very-long": ({"x" * 10_000: {**A, "dtype": "?"}}, DATA[:24], None, ["x...: unknown dtype"]),
    "name-of-control-characters": ({"\x7f" * 500: {**A, "dtype": "?"}}, DATA[:24], None, ["\\x7f", "unknown dtype"]),
}


@pytest.mark.parametrize("case", list(HEADERS))
def test_corrupt_safetensors_header(embedder, tiny_finetunes, tmp_path, case):
    header, data, length, needles = HEADERS[case]
    folder = with_weights(tiny_finetunes[0], tmp_path / "bad", safetensors_bytes(header, data, length))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    message = expect_error(embedder, folder, "cannot read model.safetensors", *needles)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 50_000  # KiB: no claimed length is allocated
    assert "Error while" not in message  # said in words, not the deserializer's
    with pytest.raises(Exception):  # the check is no stricter than safetensors: it refuses each of these too
        safe_open(str(folder / "model.safetensors"), framework="pt")


def test_valid_headers_pass_the_check(tiny_bert, tiny_finetunes, tmp_path):
    """Every real file, and the edge cases safetensors accepts, pass the header check."""
    for file in [tiny_bert / "model.safetensors", *(f / "model.safetensors" for f in tiny_finetunes)]:
        assert _safetensors_fault(file) is None
    edge = {
        "empty": ({}, b""),
        "zero-size-tensors": (
            {
                "a": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
                "b": {"dtype": "F16", "shape": [2, 0], "data_offsets": [0, 0]},
            },
            b"",
        ),
        "scalar-and-metadata": (
            {"__metadata__": {"format": "pt"}, "s": {"dtype": "F64", "shape": [], "data_offsets": [0, 8]}},
            bytes(8),
        ),
        "padded-header": (b'{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}     ', bytes(4)),
        "four-bit": ({"a": {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]}}, bytes(2)),
    }
    for case, (header, data) in edge.items():
        path = tmp_path / f"{case}.safetensors"
        path.write_bytes(safetensors_bytes(header, data))
        with safe_open(str(path), framework="pt"):
            pass
        assert _safetensors_fault(path) is None, case


# --- wrong dtypes and shapes in a batch run: recorded, and the run goes on -----------------------


def _with_tensor(
    src: Path, out: Path, value: torch.Tensor, key: str = "encoder.layer.1.attention.self.value.weight"
) -> Path:
    state = load_file(str(src / "model.safetensors"))
    state[key] = value
    return save_state(out, state, json.loads((src / "config.json").read_text()))


def _as(dtype: torch.dtype):
    return lambda src, out: _with_tensor(src, out, torch.ones(32, 32).to(dtype))


BROKEN = {
    # id: (make(src, out), words of the recorded error)
    "bool": (_as(torch.bool), ["dtype bool"]),
    "int8": (_as(torch.int8), ["dtype int8"]),
    "uint8": (_as(torch.uint8), ["dtype uint8"]),
    "int64": (_as(torch.int64), ["dtype int64"]),
    "float8_e4m3fn": (_as(torch.float8_e4m3fn), ["dtype float8_e4m3fn"]),
    "float8_e5m2": (_as(torch.float8_e5m2), ["dtype float8_e5m2"]),
    "wrong-shape": (lambda s, o: _with_tensor(s, o, torch.zeros(48, 32)), ["[48, 32]", "[32, 32]"]),
    "not-a-matrix": (lambda s, o: _with_tensor(s, o, torch.zeros(32, 32, 1)), ["expected a matrix"]),
    "truncated": (lambda s, o: with_weights(s, o, (s / "model.safetensors").read_bytes()[:-100]), ["truncated"]),
    "bad-header": (
        lambda s, o: with_weights(s, o, safetensors_bytes({"a": {**A, "dtype": "F33"}}, DATA[:24])),
        ["unknown dtype"],
    ),
}


def test_batch_run_records_broken_models_and_keeps_the_good(tiny_bert, tiny_finetunes, tmp_path):
    broken = {case: make(tiny_finetunes[0], tmp_path / case) for case, (make, _) in BROKEN.items()}
    float64 = _with_tensor(
        tiny_finetunes[2],
        tmp_path / "float64",
        load_file(str(tiny_finetunes[2] / "model.safetensors"))["encoder.layer.1.attention.self.value.weight"].double(),
    )
    good = [*tiny_finetunes, float64]  # float64 is read exactly as float32: the same vector as its source
    models = [m for pair in zip(good + [None] * len(broken), broken.values()) for m in pair if m is not None]
    result = modelvec.embed(tiny_bert, models, rank=4, store=tmp_path / "s.duckdb")

    alone = DeltaEmbedder(rank=4).fit(tiny_bert)
    names = result.metadata["model"].tolist()
    assert sorted(names) == sorted(str(m.resolve()) for m in good)
    for model in good:
        vector = result.vectors[names.index(str(model.resolve()))]
        np.testing.assert_array_equal(vector, alone.embed_one(model))
    with Store(tmp_path / "s.duckdb") as db:
        failures = dict(zip(db.reads.failures()["model"], db.reads.failures()["error"]))
    assert failures == result.failed
    for case, folder in broken.items():
        name = str(folder.resolve())
        check_message(failures[name], name, *BROKEN[case][1])


# --- index files -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sharded(tiny_finetunes, tmp_path_factory) -> Path:
    """tiny_finetunes[0] in two safetensors shards with an index."""
    out = tmp_path_factory.mktemp("sharded")
    shutil.copy(tiny_finetunes[0] / "config.json", out)
    state = load_file(str(tiny_finetunes[0] / "model.safetensors"))
    keys = sorted(state)
    weight_map = {}
    for i, part in enumerate([keys[0::2], keys[1::2]]):
        name = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({k: state[k] for k in part}, str(out / name))
        weight_map.update({k: name for k in part})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def _weight_map(folder: Path) -> dict[str, str]:
    return json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]


def _swap_shards(folder: Path) -> str:
    """The index maps each tensor to the other shard."""
    shards = sorted(set(_weight_map(folder).values()))
    weight_map = {k: shards[1 - shards.index(v)] for k, v in _weight_map(folder).items()}
    return json.dumps({"weight_map": weight_map})


def _one_shard_as(folder: Path, shard: object) -> str:
    weight_map = _weight_map(folder)
    weight_map["encoder.layer.0.attention.self.query.weight"] = shard
    return json.dumps({"weight_map": weight_map})


INDEXES = {
    # id: (index text from the sharded folder, words of the message)
    "not-json": (lambda f: "{weight_map: ", ["model.safetensors.index.json is not valid JSON"]),
    "not-an-object": (lambda f: "[]", ["is not a JSON object"]),
    "nested-deeply": (lambda f: "[" * 100_000, ["nested too deeply"]),
    "huge-integer": (lambda f: '{"weight_map": ' + "9" * 5000 + "}", ["is not valid JSON"]),
    "not-utf8": (lambda f: b'{"weight_map": "\xff"}', ["is not valid JSON"]),
    "weight-map-a-string": (lambda f: '{"weight_map": "model.safetensors"}', ["empty or not a map"]),
    "no-weight-map": (lambda f: '{"metadata": {}}', ["has no weight_map"]),
    "weight-map-empty": (lambda f: '{"weight_map": {}}', ["empty or not a map"]),
    "weight-map-a-list": (lambda f: '{"weight_map": ["model.safetensors"]}', ["empty or not a map"]),
    "shard-not-a-string": (lambda f: _one_shard_as(f, 3), ["not a file name"]),
    "shard-null": (lambda f: _one_shard_as(f, None), ["not a file name"]),
    "shard-dot-dot": (lambda f: _one_shard_as(f, ".."), ["points outside the folder"]),
    "shard-parent": (lambda f: _one_shard_as(f, "../model.safetensors"), ["points outside the folder"]),
    "shard-in-subfolder": (lambda f: _one_shard_as(f, "sub/model.safetensors"), ["points outside the folder"]),
    "shard-absolute": (lambda f: _one_shard_as(f, "/etc/passwd"), ["points outside the folder", "/etc/passwd"]),
    "shard-backslash": (lambda f: _one_shard_as(f, "..\\model.safetensors"), ["points outside the folder"]),
    "shard-nul": (lambda f: _one_shard_as(f, "model\0.safetensors"), ["points outside the folder", "\\x00"]),
    "shard-empty-name": (lambda f: _one_shard_as(f, ""), ["points outside the folder"]),
    "shard-newline": (lambda f: _one_shard_as(f, "a\nb.safetensors"), ["missing shard", "\\n"]),
    "shard-name-too-long": (lambda f: _one_shard_as(f, "x" * 5000 + ".safetensors"), ["missing shard", "..."]),
    "key-in-the-other-shard": (_swap_shards, ["lacks tensor", "model.safetensors.index.json puts there"]),
    "shard-is-the-config": (lambda f: _one_shard_as(f, "config.json"), ["cannot read config.json"]),
    "shard-is-a-folder": (lambda f: _one_shard_as(f, "folder.safetensors"), ["is not a regular file"]),
    "shard-is-a-fifo": (lambda f: _one_shard_as(f, "fifo.safetensors"), ["is not a regular file"]),
}


@pytest.mark.parametrize("case", list(INDEXES))
def test_bad_index(embedder, sharded, tmp_path, case):
    make, needles = INDEXES[case]
    folder = tmp_path / "bad"
    shutil.copytree(sharded, folder)
    (folder / "folder.safetensors").mkdir()
    if hasattr(os, "mkfifo"):
        os.mkfifo(folder / "fifo.safetensors")  # opening it to read would block: it must never be opened
    text = make(folder)
    (folder / "model.safetensors.index.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    expect_error(embedder, folder, *needles)


def test_bin_index_refuses_a_shard_outside_the_folder(embedder, tmp_path):
    folder = tmp_path / "bin-index"
    folder.mkdir()
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"a": "../../pytorch_model.bin"}}))
    expect_error(embedder, folder, "pytorch_model.bin.index.json points outside the folder")


def test_sharded_reference_still_embeds(embedder, sharded, tiny_finetunes):
    """The folder the index cases start from is sound: the same vector as the single file."""
    np.testing.assert_array_equal(embedder.embed_one(sharded), embedder.embed_one(tiny_finetunes[0]))


# --- no leaked files or maps --------------------------------------------------------------------


def _open_in(folder: Path) -> int:
    """File descriptors and memory maps of this process on files under ``folder``."""
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds += os.readlink(f"/proc/self/fd/{fd}").startswith(str(folder))
        except OSError:
            pass
    with open("/proc/self/maps") as maps:
        return fds + sum(str(folder) in line for line in maps)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc")
def test_broken_files_leave_nothing_open(embedder, tiny_finetunes, tmp_path):
    raw = (tiny_finetunes[0] / "model.safetensors").read_bytes()
    cuts = (5, 100, len(raw) - 1)
    folders = [with_weights(tiny_finetunes[0], tmp_path / f"cut{i}", raw[:cut]) for i, cut in enumerate(cuts)]
    folders += [
        with_weights(tiny_finetunes[0], tmp_path / f"h{i}", safetensors_bytes(h, d, n))
        for i, (h, d, n, _) in enumerate(HEADERS.values())
    ]
    for _ in range(3):
        for folder in folders:
            with pytest.raises(ModelvecError):
                embedder.embed_one(folder)
    gc.collect()
    assert _open_in(tmp_path) == 0
    good = Checkpoint(shutil.copytree(tiny_finetunes[1], tmp_path / "good"))
    assert good.shape("encoder.layer.0.attention.self.query.weight") == (32, 32)
    assert _open_in(tmp_path) == 0  # a shape comes from the header: nothing stays open
    good.get_stored("encoder.layer.0.attention.self.query.weight")
    assert _open_in(tmp_path) > 0  # a tensor is a view of the mapped file
    good.close()  # releases the map now, not when the object is collected
    assert _open_in(tmp_path) == 0


# --- properties: random bytes, headers and index files -----------------------------------------


def fast(examples: int) -> settings:
    """Bounded examples, no deadline (a first read is slower), no example database written into the repository."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


def read_all(path: Path) -> dict[str, torch.Tensor] | None:
    """Open a checkpoint and read every tensor, checking the property; the tensors, or None for a clean refusal."""
    try:
        with Checkpoint(path, name=NAME) as ck:
            tensors = {}
            for key in sorted(ck.keys()):
                shape = ck.shape(key)
                tensor = ck.get(key)
                assert tensor.dtype == torch.float32 and tuple(tensor.shape) == shape, key
                tensors[key] = tensor
            event("read")
            return tensors
    except ModelvecError as err:
        assert_one_line(err, NAME)
        event("refused")  # --hypothesis-show-statistics shows how often each outcome was reached
        return None


def accepted_by_safetensors(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="pt"):
            return True
    except Exception:
        return False


@pytest.fixture(scope="module")
def small_file(tmp_path_factory) -> bytes:
    """A few tensors of the dtypes checkpoints hold (edits of their data bytes keep the file readable)."""
    path = tmp_path_factory.mktemp("small") / "model.safetensors"
    save_file(
        {"w.f32": torch.randn(3, 4), "w.f16": torch.randn(5).half(), "w.bf16": torch.randn(2, 2).bfloat16()},
        str(path),
        metadata={"format": "pt"},
    )
    return path.read_bytes()


_EDIT = st.one_of(
    st.tuples(st.just("cut"), st.integers(0, 400)),
    st.tuples(st.just("set"), st.integers(0, 400), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.integers(0, 400), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 400), st.integers(1, 16)),
    st.tuples(st.just("length"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("data"), st.integers(1, 66), st.integers(0, 255)),  # a byte of the tensors' 66 data bytes
)


def _apply(raw: bytes, edit: tuple) -> bytes:
    kind, *args = edit
    at = {"length": 0, "data": len(raw) - args[0]}.get(kind, args[0] % (len(raw) + 1))
    return {
        "cut": lambda: raw[:at],
        "set": lambda: raw[:at] + bytes([args[-1]]) + raw[at + 1 :],
        "data": lambda: raw[:at] + bytes([args[-1]]) + raw[at + 1 :],
        "insert": lambda: raw[:at] + args[-1] + raw[at:],
        "delete": lambda: raw[:at] + raw[at + args[-1] :],
        "length": lambda: args[0].to_bytes(8, "little") + raw[8:],
    }[kind]()


@fast(300)
@given(edits=st.lists(_EDIT, min_size=1, max_size=4))
def test_property_mutated_file(small_file, tmp_path_factory, edits):
    path = tmp_path_factory.getbasetemp() / "mutated.safetensors"
    raw = small_file
    for edit in edits:
        raw = _apply(raw, edit)
    path.write_bytes(raw)
    read_all(path)
    assert (_safetensors_fault(path) is None) == accepted_by_safetensors(path)


_DIM_WIDE = st.one_of(st.integers(-3, 2**65), st.floats(allow_nan=True), st.text(max_size=3), st.none(), st.booleans())
_ENTRY = st.fixed_dictionaries(
    {
        "dtype": st.one_of(
            st.sampled_from(sorted(_DTYPE_BITS)), st.sampled_from(["F33", "f32", ""]), st.none(), st.integers()
        ),
        "shape": st.one_of(st.lists(st.integers(0, 5), max_size=3), st.lists(_DIM_WIDE, max_size=3), _DIM_WIDE),
        "consistent": st.booleans(),
        "offsets": st.one_of(st.lists(st.integers(-5, 2**65), min_size=0, max_size=3), _DIM_WIDE),
    }
)


@st.composite
def _headers(draw) -> tuple[object, int]:
    """A header of tensors whose offsets are often consistent (so some files are valid), and a data size."""
    entries = draw(st.dictionaries(st.text(max_size=6), _ENTRY, max_size=4))
    header: dict[str, object] = {}
    end = 0
    for name, e in entries.items():
        shape, dtype = e["shape"], e["dtype"]
        size = None
        if isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape) and dtype in _DTYPE_BITS:
            bits = math.prod(shape) * _DTYPE_BITS[dtype]
            size = bits // 8 if bits % 8 == 0 and bits < 8 * 4096 else None
        offsets = [end, end + size] if e["consistent"] and size is not None else e["offsets"]
        end = end + size if e["consistent"] and size is not None else end
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
    if draw(st.booleans()):
        header["__metadata__"] = draw(
            st.one_of(st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2), st.integers(), st.none())
        )
    return header, max(0, end + draw(st.sampled_from([0, 0, 0, -1, 1, 7])))


@fast(300)
@given(case=_headers(), seed=st.integers(0, 2**32 - 1))
def test_property_generated_header(tmp_path_factory, case, seed):
    header, data_size = case
    path = tmp_path_factory.getbasetemp() / "generated.safetensors"
    data = np.random.default_rng(seed).integers(0, 256, data_size, dtype=np.uint8).tobytes()
    path.write_bytes(safetensors_bytes(header, data))
    tensors = read_all(path)
    accepted = accepted_by_safetensors(path)
    assert (_safetensors_fault(path) is None) == accepted
    if tensors is not None:  # read: every entry was a float dtype of safetensors' liking
        assert accepted and set(tensors) == set(header) - {"__metadata__"}


@pytest.fixture(scope="module")
def shard_folder(tmp_path_factory) -> Path:
    """Two shards (a, b | c) and files an index could wrongly name: the config, a folder, a file one level up."""
    root = tmp_path_factory.mktemp("index")
    folder = root / "model"
    folder.mkdir()
    save_file({"a": torch.randn(2, 2), "b": torch.randn(3)}, str(folder / "one.safetensors"))
    save_file({"c": torch.randn(1, 4)}, str(folder / "two.safetensors"))
    save_file({"a": torch.randn(2, 2)}, str(root / "outside.safetensors"))
    (folder / "config.json").write_text("{}")
    (folder / "sub").mkdir()
    return folder


_SHARD = st.one_of(
    st.sampled_from(
        [
            "one.safetensors",
            "two.safetensors",
            "config.json",
            "model.safetensors.index.json",
            "sub",
            "../outside.safetensors",
            "/etc/passwd",
            "..",
            ".",
            "",
            "absent.safetensors",
            "a\0b",
            "x" * 300,
        ]
    ),
    st.text(max_size=8),
    st.integers(),
    st.none(),
    st.lists(st.text(max_size=2), max_size=2),
)
_VALID_MAP = {"a": "one.safetensors", "b": "one.safetensors", "c": "two.safetensors"}


@st.composite
def _edited_map(draw) -> dict[str, object]:
    """The valid weight map with up to three keys remapped (to anything) or dropped, so some stay readable."""
    weight_map: dict[str, object] = dict(_VALID_MAP)
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(["a", "b", "c", "d"]))
        if draw(st.booleans()):
            weight_map[key] = draw(_SHARD)
        else:
            weight_map.pop(key, None)
    return weight_map


_WEIGHT_MAP = _edited_map() | st.one_of(
    st.dictionaries(st.sampled_from(["a", "b", "c", "d"]) | st.text(max_size=4), _SHARD, max_size=5),
    st.none(),
    st.lists(st.text(max_size=3), max_size=2),
    st.text(max_size=5),
    st.integers(),
)


@fast(200)
@given(
    weight_map=_WEIGHT_MAP,
    extra=st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    garble=st.one_of(st.none(), st.integers(0, 60)),
)
def test_property_index(shard_folder, weight_map, extra, garble):
    text = json.dumps({**extra, "weight_map": weight_map} if weight_map is not None else extra)
    if garble is not None:  # cut the JSON short
        text = text[:garble]
    (shard_folder / "model.safetensors.index.json").write_text(text, encoding="utf-8")
    tensors = read_all(shard_folder)
    if tensors is not None:  # only files inside the folder were read, and only what the index names
        assert set(tensors) == set(weight_map)
        assert all(Path(shard).name == shard and (shard_folder / shard).is_file() for shard in weight_map.values())


def test_a_model_name_with_control_characters_still_gives_one_line(tiny_bert, tmp_path):
    """A folder (or Hub name) may hold a newline: the message escapes it, the run records it."""
    import modelvec
    from modelvec.store import Store

    odd = tmp_path / "bad\nname"
    odd.mkdir()
    result = modelvec.embed(tiny_bert, [odd], store=tmp_path / "s.duckdb")
    (reason,) = result.failed.values()
    assert "\n" not in reason and "bad\\nname" in reason and "no weights found" in reason
    with Store(tmp_path / "s.duckdb") as db:
        assert db.reads.failures()["error"].tolist() == [reason]
