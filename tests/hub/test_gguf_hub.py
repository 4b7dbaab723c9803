"""GGUF repositories on the Hub read by their own bytes: the header (metadata and tensor table) and the rows a vector
and a trace read, by byte ranges, through the real huggingface_hub client against a local Hub that counts what it
sends; the finest of a repository's files read; every quantization type's rows as the gguf package dequantizes its
whole tensor; the files' faults one line each; quantizations placed under what they round, whatever their card says."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from builders import llama_pair
from modelvec import DeltaEmbedder, Representation, embed
from modelvec.core.gguf import header_extent
from modelvec.core.spans import merge, missing
from modelvec.hub import partial
from modelvec.hub.client import HubSettings
from modelvec.hub.partial import partial_folder
from modelvec.hub.ranges import coalesce_ranges
from modelvec.hub.remote_header import GGUF_PROBE
from modelvec.read import open_checkpoint
from modelvec.run.work import plan_of
from modelvec.testing.gguf import Q, write_gguf
from modelvec.testing.localhub import LocalHub

ROWS = Representation(rows=0.05, projection="countsketch", probe="none")
#: Every block type the gguf package dequantizes, with random bytes for blocks (16 rows of 512 values).
TYPES = [
    t
    for t in Q
    if t.name not in ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64", "Q8_1", "Q8_K", "Q1_0")
    and t in gguf.GGML_QUANT_SIZES
]


def blocks(kind: Q, rows: int = 16, cols: int = 512, seed: int = 0) -> np.ndarray:
    size, nbytes = gguf.GGML_QUANT_SIZES[kind]
    return np.random.default_rng(seed).integers(0, 256, (rows, cols // size * nbytes), dtype=np.uint8)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A float32 Llama-shaped base and fine-tune (2 layers, width 512); the fine-tune as a Q8_0 GGUF whose header is
    longer than the first range asked (a 9,000-token vocabulary) and holds a tensor of every block type, and as a
    Q4_0 one."""
    root = tmp_path_factory.mktemp("gguf-hub")
    base, ft = llama_pair(root / "a", 512, 2048, 2, torch.float32, scale=1e-2)
    (root / "g").mkdir()
    extra = {f"extra.{kind.name}": (blocks(kind), kind) for kind in TYPES}
    q8 = write_gguf(ft, root / "g" / "model-Q8_0.gguf", "llama", Q.Q8_0, extra=extra, vocabulary=9_000)
    q4 = write_gguf(ft, root / "g" / "model-Q4_0.gguf", "llama", Q.Q4_0)
    yield {"base": base, "ft": ft, "q8": q8, "q4": q4}
    shutil.rmtree(root, ignore_errors=True)


def settings_of(srv, tmp_path: Path) -> HubSettings:
    return HubSettings(
        endpoint=srv.endpoint, cache_dir=str(tmp_path / "cache"), token=False, retries=1, backoff=0.01, timeout=10
    )


def gets(server, name: str) -> list[dict]:
    return [r for r in server.requests if r["method"] == "GET" and r["path"].endswith(f"/{name}")]


def spans(requests) -> list[tuple[int, int]]:
    return [
        (int(a), int(b) + 1) for r in requests for a, b in [re.fullmatch(r"bytes=(\d+)-(\d+)", r["range"]).groups()]
    ]


def test_a_gguf_repository_is_read_by_byte_ranges_from_its_finest_file(models, tmp_path, monkeypatch):
    """Two quantizations in one repository: the Q8_0 is read (the finest), by ranges only, its header in more than one
    request (9,000 tokens of metadata), and its vector is the local file's; the bytes asked are the header's and
    exactly the blocks of the rows read (no gap filled: ``GAP = 0``), under 10 % of the file."""
    monkeypatch.setattr(partial, "GAP", 0)
    hub = LocalHub(tmp_path / "hub")
    hub.publish("u/base", models["base"], link=True)
    card = b"---\nbase_model: u/ft\nbase_model_relation: quantized\n---\n"
    hub.publish("u/ft-gguf", {"model-Q8_0.gguf": models["q8"], "model-Q4_0.gguf": models["q4"], "README.md": card})
    with hub.serve() as srv:
        settings = settings_of(srv, tmp_path)
        result = embed("u/base", ["u/ft-gguf"], representation=ROWS, hub_settings=settings, store=tmp_path / "s.duckdb")
    assert result.embedded == ["u/ft-gguf"] and not result.failed
    local = DeltaEmbedder(ROWS).fit(models["base"]).embed_one(models["q8"])
    np.testing.assert_array_equal(result.vectors[0], local)
    assert not gets(srv, "model-Q4_0.gguf")  # the coarser file is never asked for
    asked = gets(srv, "model-Q8_0.gguf")
    assert asked and all(r["status"] == 206 for r in asked)
    size = models["q8"].stat().st_size
    data_start = header_extent(models["q8"].read_bytes()[: 1 << 22], size).data_start
    assert data_start > GGUF_PROBE
    head = [s for s in spans(asked) if s[0] < data_start]
    assert 2 <= len(head) <= 4 and head[0] == (0, GGUF_PROBE)
    folder = partial_folder("u/ft-gguf", srv.hub._state("u/ft-gguf")["refs"]["main"], settings)
    ck = open_checkpoint(folder / "model-Q8_0.gguf")
    planned = ck.plan_reads(plan_of(ck, ROWS, base=False))[ck.path]
    assert merge(spans(asked)) == merge([(0, max(b for _, b in head)), *planned])
    assert sum(b - a for a, b in spans(asked)) <= 0.10 * size


def test_the_gaps_between_a_files_rows_are_fetched_only_within_its_share(models, tmp_path, monkeypatch):
    """At the fetcher's own gaps, a Q4_0 file's rows would be fetched with the gaps between them; under a share of
    the file between what is asked and that, every wanted byte comes (the vector is the local file's) and what is
    fetched stays within the share, with some gaps still filled (fewer requests than ranges)."""
    ck = open_checkpoint(models["q4"])
    size = models["q4"].stat().st_size
    header = max(GGUF_PROBE, header_extent(models["q4"].read_bytes()[: 1 << 22], size).data_start)  # asked first
    planned = missing(ck.plan_reads(plan_of(ck, ROWS, base=False))[ck.path], [(0, header)])
    asked = header + sum(b - a for a, b in planned)
    free = header + sum(b - a for a, b in coalesce_ranges(planned, partial.GAP, partial.CAP))
    assert free - asked > 8192  # the premise: the gaps would cost something
    monkeypatch.setattr(partial, "SHARE", (asked + free) / 2 / size)
    hub = LocalHub(tmp_path / "hub")
    hub.publish("u/base", models["base"], link=True)
    hub.publish("u/ft-q4", {"model-Q4_0.gguf": models["q4"]})
    with hub.serve() as srv:
        settings = settings_of(srv, tmp_path)
        result = embed("u/base", ["u/ft-q4"], representation=ROWS, hub_settings=settings, store=tmp_path / "s.duckdb")
    assert result.embedded == ["u/ft-q4"] and not result.failed
    np.testing.assert_array_equal(result.vectors[0], DeltaEmbedder(ROWS).fit(models["base"]).embed_one(models["q4"]))
    fetched = spans(gets(srv, "model-Q4_0.gguf"))
    rows = [s for s in fetched if s[1] > header]
    assert asked <= sum(b - a for a, b in fetched) <= partial.SHARE * size
    assert len(rows) < len(planned)


def test_each_types_rows_are_its_whole_tensors_dequantized_rows_from_their_own_blocks(models):
    ck = open_checkpoint(models["q8"])
    reader = gguf.GGUFReader(models["q8"])
    tensors = {t.name: t for t in reader.tensors}
    wanted = np.array([11, 0, 3, 4])
    for kind in TYPES:
        name = f"extra.{kind.name}"
        with np.errstate(all="ignore"):
            whole = gguf.quants.dequantize(np.asarray(tensors[name].data), kind)
            rows = ck.rows(name, wanted)
        np.testing.assert_array_equal(rows, whole[wanted], err_msg=kind.name)
        per_row = blocks(kind).shape[1]
        start = int(tensors[name].data_offset)
        assert ck.byte_ranges({name: [(3, 5), (11, 12)]}) == {
            ck.path: [(start + 3 * per_row, start + 5 * per_row), (start + 11 * per_row, start + 12 * per_row)]
        }, kind.name


def card(parent: str) -> bytes:
    return f"---\nbase_model: {parent}\nbase_model_relation: quantized\n---\n".encode()


@pytest.fixture(scope="module")
def placed(llama_family, tmp_path_factory):
    """The tiny Llama family on the Hub with GGUF repositories of its models (the default representation): a
    truthful card, a card naming a sibling, the base quantized, a card skipping a level (c's, c not stored, naming the
    base), and faulty files beside them: one cut inside its header, one cut inside its data, one whose tensor table
    puts a tensor beyond the file, a split one with a part missing; and a's Q4_0 split in three files, read as one."""
    base, a, b, c = llama_family
    root = tmp_path_factory.mktemp("gguf-tree")
    made = {
        name: write_gguf(folder, root / f"{name}.gguf", "llama", kind)
        for name, folder, kind in (("a8", a, Q.Q8_0), ("b4", b, Q.Q4_0), ("base8", base, Q.Q8_0), ("c8", c, Q.Q8_0))
    }
    hub = LocalHub(root / "hub")
    for repo, folder in (("u/base", base), ("u/a", a), ("u/b", b)):
        hub.publish(repo, folder, link=True)
    hub.publish("u/a-gguf", {"a-Q8_0.gguf": made["a8"], "README.md": card("u/a")})
    hub.publish("u/b-gguf", {"b-Q4_0.gguf": made["b4"], "README.md": card("u/a")})  # a lie: it rounds b
    hub.publish("u/base-gguf", {"base-Q8_0.gguf": made["base8"], "README.md": card("u/base")})
    hub.publish("u/c-gguf", {"c-Q8_0.gguf": made["c8"], "README.md": card("u/base")})
    whole = made["a8"].read_bytes()
    extent = header_extent(whole, len(whole))
    lying = bytearray(whole)
    name, offset = extent.tensors[-1]
    at = whole.index(name.encode(), 24) + len(name) + 4  # its dims, type and offset follow its name
    dims = int.from_bytes(whole[at - 4 : at], "little")
    where = at + 8 * dims + 4
    assert int.from_bytes(whole[where : where + 8], "little") == offset
    lying[where : where + 8] = (len(whole) + 4096).to_bytes(8, "little")
    faulty = {"head-cut": whole[:100], "data-cut": whole[: extent.data_start + 64], "lying": bytes(lying)}
    for repo, data in faulty.items():
        hub.publish(f"u/{repo}", {"model-Q8_0.gguf": data, "README.md": card("u/a")})
    (root / "split").mkdir()
    first = write_gguf(a, root / "split" / "a-Q4_0.gguf", "llama", Q.Q4_0, split=7)
    made["a4"] = write_gguf(a, root / "a4.gguf", "llama", Q.Q4_0)
    parts = {p.name: p for p in sorted(first.parent.iterdir())}
    assert len(parts) == 3
    hub.publish("u/a-split", {**parts, "README.md": card("u/a")})
    lost = {n: p for n, p in parts.items() if "-00002-" not in n}
    hub.publish("u/split", {**lost, "README.md": card("u/a")})  # a part missing
    store = root / "s.duckdb"
    with hub.serve() as srv:
        settings = settings_of(srv, root)
        models = ["u/a", "u/b", "u/a-gguf", "u/b-gguf", "u/base-gguf", "u/c-gguf", "u/a-split"]
        models += [f"u/{r}" for r in faulty]
        models.append("u/split")
        result = embed("u/base", models, hub_settings=settings, store=store)
    return store, result, {"base": base, "a4": made["a4"]}


def test_each_hub_quantization_is_placed_under_what_it_rounds_and_a_lying_card_is_flagged(placed, tmp_path):
    from modelvec.report.tree import model_tree

    store, result, files = placed
    assert sorted(result.embedded) == sorted(
        ["u/a", "u/b", "u/a-gguf", "u/b-gguf", "u/base-gguf", "u/c-gguf", "u/a-split"]
    )
    nodes = {n.model: n for n in model_tree("u/base", store=store).nodes}
    placed = {"u/a-gguf": "u/a", "u/b-gguf": "u/b", "u/base-gguf": "u/base", "u/c-gguf": "u/base", "u/a-split": "u/a"}
    for name, parent in placed.items():
        node = nodes[name]
        assert node.kind == "quantization" and node.parent == parent, (name, node.kind, node.parent)
    assert nodes["u/a-gguf"].agrees and not nodes["u/b-gguf"].agrees  # the card naming a, of b's rounding, is flagged
    assert (nodes["u/a-gguf"].quantized, nodes["u/b-gguf"].quantized, nodes["u/a-split"].quantized) == (
        "Q8_0",
        "Q4_0",
        "Q4_0",
    )
    assert (
        nodes["u/a"].quantized is None
        and model_tree("u/base", store=store).as_json() == model_tree("u/base", store=store).as_json()
    )
    vectors = dict(zip(result.metadata["model"], result.vectors))
    whole = embed(files["base"], [files["a4"]], store=tmp_path / "local.duckdb").vectors[0]
    np.testing.assert_array_equal(vectors["u/a-split"], whole)  # three files, one model: the one file's vector


def test_a_faulty_gguf_on_the_hub_is_one_line_and_recorded_and_nothing_else_is_lost(placed):
    _, result, _ = placed
    said = {m: line.splitlines() for m, line in result.failed.items()}
    assert set(said) == {"u/head-cut", "u/data-cut", "u/lying", "u/split"} and all(len(v) == 1 for v in said.values())
    assert "a GGUF split in 3 files, 2 of them in the repository" in said["u/split"][0]
    assert "truncated: the file (100 bytes) ends inside its header" in said["u/head-cut"][0]
    assert re.search(r"its tensor table puts '.+' at byte [\d,]+ of [\d,]+", said["u/data-cut"][0])
    assert re.search(r"its tensor table puts '.+' at byte [\d,]+ of [\d,]+", said["u/lying"][0])
    assert len(result.embedded) == 7  # the others embedded beside them
