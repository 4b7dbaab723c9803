"""The model tree inferred from stored traces, on real checkpoints of a tiny BERT with all-MiniLM-L6-v2's widths:
fine-tunes, a fine-tune of a fine-tune, a merge, an int8 round trip, unrelated weights and an adapter trained on a
fine-tune, each placed and named by its weights; a card that says otherwise is flagged; ``modelvec tree``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file

from builders import int8_round_trip, perturb_layers, save_state, tiny_bert_config
from modelvec import embed
from modelvec.report.tree import model_tree


def _bert():
    from transformers import BertModel

    return BertModel(
        tiny_bert_config(hidden_size=384, intermediate_size=768, num_hidden_layers=2, max_position_embeddings=32)
    )


def _card(folder, base_model, relation=None) -> None:
    extra = f"base_model_relation: {relation}\n" if relation else ""
    (folder / "README.md").write_text(f"---\nbase_model: {json.dumps(base_model)}\n{extra}---\n")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree-zoo")
    torch.manual_seed(0)
    model = _bert()
    model.save_pretrained(root / "base")
    for name, seed in (("a", 1), ("b", 2)):
        torch.manual_seed(0)
        ft = _bert()
        perturb_layers(ft, seed, 0.002)
        ft.save_pretrained(root / name)
        _card(root / name, "base", "finetune")
        if name == "a":
            perturb_layers(ft, 3, 0.001)  # trained further: a's child
            ft.save_pretrained(root / "c")
            _card(root / "c", "base", "finetune")  # a wrong card: it names the base, not a
            peft_model = get_peft_model(ft, LoraConfig(init_lora_weights=False, r=4, target_modules=["query", "value"]))
            with torch.no_grad():  # a trained adapter's size, not a random one's
                for n, p in peft_model.named_parameters():
                    if "lora_B" in n:
                        p.mul_(0.01)
    a, b = load_file(str(root / "a" / "model.safetensors")), load_file(str(root / "b" / "model.safetensors"))
    a_config = json.loads((root / "a" / "config.json").read_text())
    save_state(root / "merge", {k: 0.5 * a[k] + 0.5 * b[k] for k in a}, a_config)
    _card(root / "merge", ["a", "b"], "merge")
    save_state(root / "a-int8", int8_round_trip(a), a_config)
    torch.manual_seed(9)
    _bert().save_pretrained(root / "unrelated")
    peft_model.save_pretrained(root / "lora-on-c")
    config = root / "lora-on-c" / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "base_model_name_or_path": str(root / "c")}))
    shutil.copytree(root / "b", root / "b-copy")  # a re-upload of b's very weights
    models = [root / m for m in ("a", "b", "c", "merge", "a-int8", "unrelated", "lora-on-c", "b-copy")]
    store = root / "s.duckdb"
    result = embed(root / "base", models, store=store, load=False)
    assert result.failed == {}
    return root, store


def test_each_model_is_placed_and_named_by_its_weights(zoo):
    root, store = zoo
    tree = model_tree(root / "base", store=store)
    by = {n.model.rsplit("/", 1)[-1]: n for n in tree.nodes}
    name = {n.model: n.model.rsplit("/", 1)[-1] for n in tree.nodes} | {str(root / "base"): "base"}
    got = {m: (n.kind, sorted(name[p] for p in n.parents)) for m, n in by.items()}
    assert got == {
        "a": ("fine-tune", ["base"]),
        "b": ("fine-tune", ["base"]),
        "c": ("fine-tune", ["a"]),
        "merge": ("merge", ["a", "b"]),
        "a-int8": ("quantization", ["a"]),
        "unrelated": ("unrelated", []),
        "lora-on-c": ("adapter", ["c"]),
        "b-copy": ("copy", ["b"]),
    }
    assert by["b-copy"].copy_of == str(root / "b") and by["b"].copy_of is None
    # a byte copy (copytree keeps the files' modification times, not their change times): made after b
    assert by["b-copy"].resaved is None and by["b-copy"].original_by == "created first"
    assert by["merge"].weights == pytest.approx([0.5, 0.5], abs=0.02)
    # c's card names the base, its weights go beyond a; b-copy's card says a fine-tune of the base, it is b's weights
    assert sorted(m for m, n in by.items() if not n.agrees) == ["b-copy", "c"]
    assert by["c"].declared_relation == "finetune" and by["c"].declared_parents == [str(root / "base")]
    only = model_tree(root / "base", store=store, only=[str(root / "c")])
    assert [n.model for n in only.nodes] == [str(root / "c")] and only.nodes[0].parent == str(root / "a")


def test_the_command_prints_the_tree_draws_it_and_answers_json(zoo, tmp_path):
    root, store = zoo
    env_cli = [sys.executable, "-m", "modelvec.cli", "tree", str(root / "base"), "--store", str(store)]
    out = subprocess.run([*env_cli, "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["base"] == str(root / "base") and len(answer["models"]) == 8
    for m in answer["models"]:
        assert set(m) >= {"model", "parent", "parents", "kind", "confidence", "declared", "agrees"}
        assert m["parents"] == ([m["parent"]] if m["kind"] not in ("merge", "unrelated") else m["parents"])
        assert 0.5 <= m["confidence"] <= 1
    text = subprocess.run(
        [*env_cli, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert any(f"b-copy: a copy of {root / 'b'} (identical weights)" in line for line in lines)
    assert any(line.endswith("/c: fine-tune (0.71); its card says finetune of " + str(root / "base")) for line in lines)
    assert "1 unrelated, 2 whose card the weights contradict" in text.stdout
    assert (tmp_path / "tree.png").stat().st_size > 10_000


def test_neighbors_names_a_stored_models_parent_and_kind(zoo):
    root, store = zoo
    cli = [sys.executable, "-m", "modelvec.cli", "neighbors", str(root / "merge"), "--store", str(store)]
    out = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    node = json.loads(out.stdout)["tree"]
    assert node["kind"] == "merge" and sorted(node["parents"]) == [str(root / "a"), str(root / "b")] and node["agrees"]
    text = subprocess.run(cli[:4] + [str(root / "c"), *cli[5:]], capture_output=True, text=True, timeout=300)
    assert f"c: fine-tune of {root / 'a'} (confidence" in text.stdout
    assert f"its card says finetune of {root / 'base'}" in text.stdout


def test_the_html_map_draws_the_tree_behind_a_toggle(zoo, tmp_path):
    from modelvec.report import cluster

    root, store = zoo
    report = cluster(root / "base", store=store, out=tmp_path, reduce="pca")
    page = (tmp_path / "clusters-pca.html").read_text()
    assert "tree edges on" in page and "tree edges off" in page
    start = page.index('"name":"model tree"')
    trace = page[page.rindex("{", 0, start) : page.index("}", start)]
    # between mapped models: c-a, a-int8-a, merge-a, merge-b, lora-on-c-c (the base is not on the map, nor b-copy:
    # a copy of b, counted once as b)
    assert trace.count("null") == 2 * 5 and report.files["html"].endswith("clusters-pca.html")
