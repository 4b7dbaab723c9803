"""Quantizations placed, not only recorded: real GGUF quantizations (Q8_0, Q4_0, by the gguf package's own
quantizers, written as llama.cpp's converter writes them) of tiny Llama fine-tunes get a trace from a few rows of
their blocks, are placed under the fine-tune they round (under the base where it is not stored), checked against
what their cards declare, and are never a point on the map."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import modelvec
from modelvec.read import open_checkpoint
from modelvec.report.tree import model_tree
from modelvec.testing.gguf import Q, write_gguf


@pytest.fixture(scope="module")
def zoo(llama_family, tmp_path_factory):
    base, a, b, c = llama_family
    root = tmp_path_factory.mktemp("quantized")
    files = {}
    for parent, qtype in ((a, Q.Q8_0), (a, Q.Q4_0), (b, Q.Q4_0), (c, Q.Q8_0)):
        folder = root / f"{parent.name}-{qtype.name}"
        folder.mkdir()
        files[folder.name] = write_gguf(parent, folder / f"model-{qtype.name}.gguf", "llama", qtype)
    card = f"---\nbase_model: {json.dumps(str(a))}\nbase_model_relation: quantized\n---\n"
    (root / "a-Q8_0" / "README.md").write_text(card)
    (root / "b-Q4_0" / "README.md").write_text(card)  # a wrong card: it rounds b, not a
    store = root / "s.duckdb"
    result = modelvec.embed(base, [a, b, *files.values()], store=store, load=False)  # c is not stored
    assert result.failed == {}
    return base, store, files, result


def test_a_gguf_is_read_a_few_rows_at_a_time_in_the_hugging_face_rows_order(zoo):
    _, _, files, _ = zoo
    ck = open_checkpoint(files["a-Q4_0"])
    assert ck.quantized_types() == ["Q4_0"]
    for key in (
        "layers.0.self_attn.q_proj.weight",
        "layers.1.self_attn.k_proj.weight",
        "layers.0.mlp.down_proj.weight",
    ):
        whole, rows = ck.get(key), ck.get_stored(key, whole=False)
        assert tuple(rows.shape) == tuple(whole.shape)
        assert torch.equal(rows[3:17, 5:40], whole[3:17, 5:40])  # Q and K's rows un-permuted as llama.cpp stores them


def test_each_quantization_is_placed_under_what_it_rounds_and_checked_against_its_card(zoo):
    base, store, files, result = zoo
    nodes = {
        Path(n.model).parent.name if n.model.endswith(".gguf") else Path(n.model).name: n
        for n in model_tree(base, store=store).nodes
    }
    for name, parent in (("a-Q8_0", "a"), ("a-Q4_0", "a"), ("b-Q4_0", "b"), ("c-Q8_0", "base")):
        node = nodes[name]
        assert node.kind == "quantization" and Path(node.parent).name == parent, (name, node.kind, node.parent)
    assert nodes["a-Q8_0"].agrees and not nodes["b-Q4_0"].agrees  # the card that names a is flagged
    assert nodes["a"].kind == nodes["b"].kind == "fine-tune"
    assert sum("a quantization (Q4_0)" in note for note in result.notes) == 1


def test_a_quantization_is_no_point_on_the_map(zoo, tmp_path):
    base, store, files, _ = zoo
    report = modelvec.cluster(base, store=store, out=tmp_path, reduce="pca")
    assert report.n_models == 2 and len(report.population["quantized"]) == 4
    assert any("4 quantizations left off the map" in line for line in report.notes)
    near = modelvec.neighbors(base.parent / "a", store=store, k=5)
    assert not {str(p) for p in files.values()} & set(near.nearest["model"])


def test_the_tree_says_each_quantizations_type_on_its_line(zoo):
    from typer.testing import CliRunner

    from modelvec.cli import app

    base, store, files, _ = zoo
    out = CliRunner().invoke(app, ["tree", str(base), "--store", str(store)], terminal_width=200)
    assert out.exit_code == 0, out.output
    lines = {name: [line for line in out.output.splitlines() if f"{name}/model-" in line] for name in files}
    for name in files:
        (line,) = lines[name]
        assert f": quantization {name.split('-')[1]} (" in line, line
