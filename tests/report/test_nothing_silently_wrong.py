"""Nothing silently wrong: every file a report reads again is verified or recomputed, and the reports see one
population per base. Each case a user met (the issue "Nothing silently wrong"), on real tiny BERT checkpoints:

1. a base saved again at its path, the fine-tunes embedded again: one population, the earlier one said and dropped by
   ``compact``; a base changed and nothing embedded again: one line;
2. bytes damaged inside the kept products: the damaged rows computed again, the answer unchanged, said in one line;
3. a damaged mutual-proximity spread file: computed again, never a bug;
4. a vector damaged after its products were kept: ``neighbors`` leaves it out, as ``cluster`` does;
5. models without a trace: named in ``tree`` with the remedy, their children placed by their cards, the tree partial;
6. models whose weights are the base's: a copy of the base, off the map and out of every score, with a count;
7. an adapter on a fine-tune: embedded on the model its config names however it was listed, or refused in one line;
8. settings given two ways (tests/core/test_settings.py, tests/run/test_pipeline.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import modelvec
from builders import maps_not_drawn, peft_adapter, save_state, tiny_bert_config
from modelvec import Store
from modelvec.analyse.tree import Node, Tree
from modelvec.analyse.tree.lineage import infer_tree
from modelvec.cli import app
from modelvec.store.formats.cachefile import read_cache_file

DATASETS = ("news", "tweets", "chat", "reviews")


def finetune(base: Path, out: Path, dataset: int, seed: int, card: str | None = None) -> Path:
    """A fine-tune of ``base``: a delta shared by its dataset plus its own, every layer matrix; a card naming the
    dataset (and ``card`` as its base_model)."""
    state = load_file(str(base / "model.safetensors"))
    g_data, g_own = torch.Generator().manual_seed(100 + dataset), torch.Generator().manual_seed(seed)
    new = {}
    for key, value in sorted(state.items()):
        if ".layer." in key and key.endswith(".weight") and value.ndim == 2:
            shared = torch.randn(value.shape[0], 2, generator=g_data) @ torch.randn(2, value.shape[1], generator=g_data)
            own = torch.randn(value.shape, generator=g_own)
            value = value + 0.02 * (shared / shared.norm() + 0.3 * own / own.norm())
        new[key] = value
    save_state(out, new, json.loads((base / "config.json").read_text()))
    said = f"base_model: {card}\n" if card else ""
    (out / "README.md").write_text(f"---\n{said}datasets:\n- {DATASETS[dataset]}\n---\n")
    return out


def lora(parent: Path, out: Path, seed: int, names: str | None = None) -> Path:
    """A PEFT LoRA adapter trained (a seeded step) on ``parent``; its config names ``names`` (default: ``parent``)."""
    return peft_adapter(parent, out, r=4, scale=0.05, seed=seed, names=names or str(parent))


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    from transformers import BertModel

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("base") / "base"
    BertModel(tiny_bert_config(hidden_size=64, intermediate_size=128)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def zoo(base, tmp_path_factory) -> list[Path]:
    """Eight full fine-tunes on four datasets and two LoRA adapters (so ``--scaling auto`` ranks by mutual proximity
    and a spread is kept)."""
    root = tmp_path_factory.mktemp("zoo")
    models = [finetune(base, root / f"{DATASETS[d]}-{s}", d, 10 * d + s) for d in range(4) for s in range(2)]
    for i, d in enumerate((0, 1)):
        adapter = lora(base, root / f"{DATASETS[d]}-lora", seed=50 + i)
        (adapter / "README.md").write_text(f"---\ndatasets:\n- {DATASETS[d]}\n---\n")
        models.append(adapter)
    return models


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def answer(out: str) -> str:
    """A command's JSON answer without where it wrote its figures (each test writes them to its own folder), as
    text (NaN equals NaN), each number to 9 digits: a product computed again may differ from the kept one in its
    last bit (float64 sums in another order)."""

    def rounded(value: object) -> object:
        if isinstance(value, float):
            return float(f"{value:.9g}")
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items() if k not in ("files", "store")}
        if isinstance(value, list):
            return [rounded(v) for v in value]
        return value

    return json.dumps(rounded(json.loads(out)), sort_keys=True)


def answers(store: Path, base: Path, query: Path, out: Path) -> dict[str, tuple[int, str, str]]:
    """Every analysis command's answer (``--json``) on the store: exit status, stdout and stderr. ``cluster``'s answer
    carries its map's coordinates too (``map``), taken where its figures would be drawn (:func:`maps_not_drawn`):
    what a kept layout gives is compared, not pixels."""
    with maps_not_drawn() as maps:
        code, out_, err = invoke(
            "cluster", str(base), "--store", str(store), "--out", str(out), "--reduce", "pca", "--json"
        )
    if code == 0:
        assert len(maps) == 1, err
        out_ = json.dumps({**json.loads(out_), "map": maps[0]})
    return {
        "cluster": (code, out_, err),
        "neighbors": invoke("neighbors", str(query), "--store", str(store), "--json"),
        "tree": invoke("tree", str(base), "--store", str(store), "--json", "--out", str(out)),
        "show": invoke("show", "--store", str(store), "--json"),
    }


@pytest.fixture(scope="module")
def kept(base, zoo, tmp_path_factory):
    """A store with every kept file made (products, spreads) by running each command once, and its answers."""
    root = tmp_path_factory.mktemp("kept")
    store = root / "s.duckdb"
    result = modelvec.embed(base, zoo, store=store, load=False)
    assert result.failed == {} and len(result.embedded) == 10
    first = answers(store, base, zoo[0], root / "out")
    assert all(code == 0 for code, _, _ in first.values()), first
    again = answers(store, base, zoo[0], root / "out")
    assert {k: answer(v[1]) for k, v in again.items()} == {k: answer(v[1]) for k, v in first.items()}
    return root, store, first


def kept_files(store: Path, base: Path) -> dict[str, Path]:
    """Every file the store keeps: the store, the vector file, the products (``products``: the population's) and
    the arrays kept beside them, by name."""
    from modelvec.core.names import model_id
    from modelvec.store.derived.cache import CacheFolder

    files = {"store": store, "vectors": Path(f"{store}.vectors")}
    main = CacheFolder(store).products_path(f"{model_id(base)}\n{modelvec.Representation().key()}\n")
    for path in sorted(Path(f"{store}.products").iterdir()):
        files["products" if path == main else path.name] = path
    return files


def copy_store(root: Path, into: Path) -> Path:
    for path in root.iterdir():
        if path.name.startswith("s.duckdb"):
            (shutil.copytree if path.is_dir() else shutil.copy2)(path, into / path.name)
    return into / "s.duckdb"


def overwrite(path: Path, array: str, at: int) -> None:
    """Two bytes overwritten ``at`` bytes into the kept array ``array`` of the kept file ``path``."""
    start = read_cache_file(path).arrays[array].offset
    with open(path, "r+b") as fh:
        fh.seek(start + at)
        fh.write(b"\x5a\x5a")


# --- 2, 3: kept files damaged -------------------------------------------------------------------------


def test_every_kept_file_is_there_and_verified_on_the_next_run(kept, base):
    root, store, first = kept
    names = set(kept_files(store, base))
    assert {"store", "vectors", "products"} <= names and any(".spread-" in n for n in names), names
    assert any(".tree." in n for n in names), names
    assert any(".pairs-" in n for n in names) and any(".map-" in n for n in names), names  # cluster's
    assert any(".blocks-" in n for n in names), names
    assert json.loads(first["cluster"][1])["scaling"] == "mutual-proximity"


@pytest.mark.parametrize(
    "damage",
    ["sixteen bytes", "a diagonal entry's sign", "an exponent bit", "the header", "cut short"],
)
def test_damaged_products_are_computed_again_and_the_answer_is_the_same(kept, base, zoo, tmp_path, damage):
    root, _, first = kept
    store = copy_store(root, tmp_path)
    path = kept_files(store, base)["products"]
    gram = read_cache_file(path).arrays["gram"]
    n, start = gram.shape[0], gram.offset
    with open(path, "r+b") as fh:
        if damage == "sixteen bytes":  # inside row 3
            fh.seek(start + 8 * (3 * n + 2))
            fh.write(b"\x5a" * 16)
        elif damage == "a diagonal entry's sign":
            fh.seek(start + 8 * (5 * n + 5) + 7)
            byte = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([byte[0] ^ 0x80]))
        elif damage == "an exponent bit":
            fh.seek(start + 8 * (1 * n + 4) + 6)
            byte = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([byte[0] ^ 0x40]))
        elif damage == "the header":
            fh.seek(40)
            fh.write(b"!")
        else:
            fh.truncate(start + 8 * n * 2 + 3)
    again = answers(store, base, zoo[0], tmp_path / "out")
    for command in ("cluster", "neighbors"):
        code, out, err = again[command]
        assert code == 0 and answer(out) == answer(first[command][1]), (command, err)
    said = again["cluster"][2]
    assert said.count("\n") == 1 and said.startswith(f"note: {path}") and "computed again" in said
    assert "note:" not in answers(store, base, zoo[0], tmp_path / "out")["cluster"][2]  # kept again, whole


@pytest.mark.parametrize("damage", ["cut short", "a flipped byte"])
def test_a_damaged_spread_file_is_computed_again_never_a_bug(kept, base, zoo, tmp_path, damage):
    root, _, first = kept
    store = copy_store(root, tmp_path)
    path = next(p for name, p in kept_files(store, base).items() if ".spread-" in name)
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        if damage == "cut short":
            fh.truncate(size - 5)
        else:
            fh.seek(size - 3)
            fh.write(b"\xff")
    for command in ("cluster", "neighbors"):
        code, out, err = answers(store, base, zoo[0], tmp_path / "out")[command]
        assert code == 0 and answer(out) == answer(first[command][1]) and "bug" not in err, (command, err)
    assert "note:" not in answers(store, base, zoo[0], tmp_path / "out")["neighbors"][2]


def kept_then_redone(kept, base, zoo, tmp_path, mark: str, step: str, array: str, at: int) -> tuple[Path, Path]:
    """A later ``cluster`` answers from the file kept beside the store whose name holds ``mark`` (``step``, a
    function of the cluster report's modules, not run); that file's ``array`` damaged ``at`` bytes in, ``step`` runs
    once, the answer is the same, the note is one line and the file is kept again as it was. The store copied for
    it, and the file."""
    from unittest import mock

    from modelvec.report import cluster_parts, clusters

    clusters = clusters if hasattr(clusters, step) else cluster_parts
    root, _, first = kept
    store = copy_store(root, tmp_path)
    path = next(p for name, p in kept_files(store, base).items() if mark in name)
    before = np.array(read_cache_file(path).arrays[array])
    with mock.patch.object(clusters, step, side_effect=AssertionError(f"{step} run again")):
        code, out, err = answers(store, base, zoo[0], tmp_path / "out")["cluster"]
        assert code == 0 and answer(out) == answer(first["cluster"][1]), err
    overwrite(path, array, at)
    with mock.patch.object(clusters, step, wraps=getattr(clusters, step)) as run:
        code, out, err = answers(store, base, zoo[0], tmp_path / "out")["cluster"]
        assert code == 0 and answer(out) == answer(first["cluster"][1]) and run.call_count == 1
    assert err.count("\n") == 1 and err.startswith(f"note: {path}"), err
    np.testing.assert_array_equal(read_cache_file(path).arrays[array], before)
    return store, path


def test_the_map_is_kept_and_laid_out_again_where_its_file_does_not_verify(kept, base, zoo, tmp_path):
    """A later ``cluster`` draws the layout kept for exactly these vectors (no reduction run); a damaged kept layout
    is laid out again, the same, and said in one line."""
    kept_then_redone(kept, base, zoo, tmp_path, ".map-pca-", "reduce_to_2d", "xy", 8 * 3 + 2)  # in its second row


def test_the_per_block_scores_are_kept_and_computed_again_where_they_do_not_hold(kept, base, zoo, tmp_path):
    """A later ``cluster`` reads the per-block scores kept for exactly these vectors and labels (none computed); a
    damaged kept file is computed again, the same, and said in one line; other labels (a label source kept alone)
    compute them again."""
    from unittest import mock

    from modelvec.report import cluster_parts

    first = kept[2]
    store, _ = kept_then_redone(kept, base, zoo, tmp_path, ".blocks-", "block_knn_scores", "scores", 2)  # 1st block
    args = ["cluster", str(base), "--store", str(store), "--out", str(tmp_path / "o"), "--reduce", "pca", "--json"]
    with mock.patch.object(cluster_parts, "block_knn_scores", wraps=cluster_parts.block_knn_scores) as computed:
        code, out, err = invoke(*args, "--label-source", "tag")  # the zoo's labels are its cards': none left
        assert code == 0 and computed.call_count == 1, err
        assert "note:" not in err
        assert json.loads(out)["per_block"] != json.loads(first["cluster"][1])["per_block"]


# --- 4: a vector damaged after its products were kept -----------------------------------------------------


def test_neighbors_leaves_out_a_vector_damaged_after_its_products_were_kept(kept, base, zoo, tmp_path):
    root, _, first = kept
    store = copy_store(root, tmp_path)
    nearest = json.loads(first["neighbors"][1])["nearest"][0]["model"]
    with Store(store, read_only=True) as db:
        offset = db.con.execute('SELECT "offset" FROM vectors WHERE model = ?', [nearest]).fetchone()[0]
    with open(f"{store}.vectors", "r+b") as fh:
        fh.seek(offset + 12)
        fh.write(b"\x01\x02\x03")
    code, out, err = invoke("neighbors", str(zoo[0]), "--store", str(store), "--json")
    assert code == 1 and f"left out: {nearest}: its stored vector" in err
    assert nearest not in [row["model"] for row in json.loads(out)["nearest"]]
    code, _, err = invoke("neighbors", nearest, "--store", str(store))
    assert code == 2 and err.strip().count("\n") == 0 and "does not match its checksum" in err
    code, _, err = invoke("cluster", str(base), "--store", str(store), "--out", str(tmp_path / "o"), "--reduce", "pca")
    assert code == 1 and f"left out: {nearest}" in err


# --- 1: the base saved again ------------------------------------------------------------------------------


def test_a_base_saved_again_is_one_population_said_and_dropped_by_compact(base, zoo, tmp_path):
    here = shutil.copytree(base, tmp_path / "base")
    models = [finetune(here, tmp_path / f"m{d}{s}", d, 10 * d + s) for d in range(4) for s in range(2)]
    store = tmp_path / "s.duckdb"
    modelvec.embed(here, models, store=store, load=False)
    before = invoke("cluster", str(here), "--store", str(store), "--out", str(tmp_path / "o"), "--json")
    state = load_file(str(here / "model.safetensors"))
    save_file(state, str(here / "model.safetensors"), metadata={"format": "pt", "saved": "again"})  # same weights
    code, _, err = invoke("cluster", str(here), "--store", str(store), "--out", str(tmp_path / "o"))
    assert code == 2 and "the base has changed since its 8 vectors" in err and "embed its fine-tunes again" in err
    again = modelvec.embed(here, models, store=store, load=False)
    assert len(again.embedded) == 8 and any("base has changed" in note for note in again.notes)
    code, out, err = invoke("cluster", str(here), "--store", str(store), "--out", str(tmp_path / "o"), "--json")
    report = json.loads(out)
    assert code == 0 and report["n_models"] == 8 and report["population"]["stale"] == 8
    assert "note: 8 stored vectors" in err and "modelvec compact" in err
    assert report["knn_score"] == json.loads(before[1])["knn_score"]  # the same weights: the same map
    near = modelvec.neighbors(models[0], store=store, k=3)
    assert str(models[0].resolve()) not in list(near.nearest["model"])
    code, out, _ = invoke("tree", str(here), "--store", str(store), "--out", str(tmp_path / "o"))
    assert code == 0 and out.count(models[0].name + ":") == 1 and "8 models" in out
    code, out, _ = invoke("show", "--store", str(store))
    assert "8 vectors of" in out and "earlier version of the base" in out
    code, out, _ = invoke("compact", "--store", str(store))
    assert code == 0 and "dropped 8 vectors" in out
    code, out, err = invoke("cluster", str(here), "--store", str(store), "--out", str(tmp_path / "o"), "--json")
    assert json.loads(out)["population"]["stale"] == 0 and "note:" not in err
    with Store(store, read_only=True) as db:
        assert len(db.reads.metadata()) == 8 and db.versions.stale().empty


def test_the_tree_is_acyclic_whatever_it_is_given():
    """A cycle of parents (what two rows of one model once made) is walked once; cards that name each other in a
    circle are refused where the circle closes."""
    loop = Tree("base", [Node(model="a", kind="fine-tune", parent="b", parents=["b"], confidence=1.0)])
    loop.nodes.append(Node(model="b", kind="fine-tune", parent="a", parents=["a"], confidence=1.0))
    assert sorted(n.model for n, _ in loop.ordered()) == ["a", "b"]
    tree = infer_tree(
        "base",
        ["t"],
        np.ones((1, 8)),
        10.0,
        [1.0],
        declared={"a": ("finetune", ["b"]), "b": ("finetune", ["a"])},
        untraced={"a": "no trace", "b": "no trace"},
    )
    parents = {n.model: n.parents for n in tree.nodes}
    assert not (parents["a"] == ["b"] and parents["b"] == ["a"])
    assert any(n.note and "descends from it" in n.note for n in tree.nodes)
    selfish = infer_tree(  # a card naming the model itself among its parents
        "base", ["t"], np.ones((1, 8)), 10.0, [1.0], declared={"s": ("finetune", ["s"])}, untraced={"s": "no trace"}
    )
    node = next(n for n in selfish.nodes if n.model == "s")
    assert node.parents == ["base"] and [m for m, _ in selfish.ordered()].count(node) == 1


# --- 5: models without a trace ------------------------------------------------------------------------------


def test_models_without_a_trace_are_named_and_their_children_placed_by_their_cards(base, tmp_path):
    parent = finetune(base, tmp_path / "parent", 0, 1)
    child = finetune(parent, tmp_path / "child", 0, 2, card="parent")
    other = finetune(base, tmp_path / "other", 1, 3)
    store = tmp_path / "s.duckdb"
    modelvec.embed(base, [parent, child, other], store=store, load=False)
    with Store(store) as db:  # as a store written before traces were kept, then added to
        db.con.execute("DELETE FROM traces WHERE model = ?", [str(parent.resolve())])
    from modelvec.report.tree import model_tree

    tree = model_tree(base, store=store)
    by = {Path(n.model).name: n for n in tree.nodes}
    assert len(tree.nodes) == 3 and tree.partial
    assert by["parent"].kind == "untraced" and "embed it again with --force" in by["parent"].note
    assert by["child"].parent == str(parent.resolve()) and "as its card says" in by["child"].note
    code, out, _ = invoke("tree", str(base), "--store", str(store), "--out", str(tmp_path / "o"))
    assert code == 0 and "3 models" in out and "the tree is partial: 1 of 3 models have no trace" in out
    assert "parent: untraced, no trace stored" in out


def test_a_damaged_trace_leaves_its_model_untraced_and_says_so(base, tmp_path):
    models = [finetune(base, tmp_path / f"m{i}", i % 2, i) for i in range(3)]
    store = tmp_path / "s.duckdb"
    modelvec.embed(base, models, store=store, load=False)
    with Store(store, read_only=True) as db:
        offset = db.con.execute('SELECT "offset" FROM traces WHERE model = ?', [str(models[1].resolve())]).fetchone()
    with open(f"{store}.vectors", "r+b") as fh:
        fh.seek(offset[0] + 4)
        fh.write(b"\x00\x11")
    code, out, err = invoke("tree", str(base), "--store", str(store), "--json")
    found = {Path(m["model"]).name: m for m in json.loads(out)["models"]}
    assert code == 1 and found["m1"]["kind"] == "untraced" and "stored trace" in found["m1"]["note"]
    assert f"left out: {models[1].resolve()}: its stored trace" in err


# --- 6: copies of the base ------------------------------------------------------------------------------------


def test_copies_of_the_base_are_named_so_and_left_out_of_every_score(base, zoo, tmp_path):
    copies = [shutil.copytree(base, tmp_path / name) for name in ("reupload-1", "reupload-2")]
    store = tmp_path / "s.duckdb"
    result = modelvec.embed(base, [*zoo[:4], *copies], store=store, load=False)
    assert sorted(Path(m).name for m in next(v for k, v in result.notes.items() if "copy of the base" in k)) == [
        "reupload-1",
        "reupload-2",
    ]
    code, out, err = invoke("cluster", str(base), "--store", str(store), "--out", str(tmp_path / "o"), "--json")
    report = json.loads(out)
    assert code == 0 and report["n_models"] == 4 and len(report["population"]["copies"]) == 2
    assert "note: 2 models whose weights are the base's (a copy of the base) left off the map" in err
    tree = {
        Path(n["model"]).name: n
        for n in json.loads(invoke("tree", str(base), "--store", str(store), "--json")[1])["models"]
    }
    assert tree["reupload-1"]["kind"] == tree["reupload-2"]["kind"] == "copy"
    assert tree["reupload-2"]["copy_of"] == str(base) and tree["reupload-2"]["parent"] == str(base)
    code, out, _ = invoke("tree", str(base), "--store", str(store), "--out", str(tmp_path / "o"))
    assert out.count("a copy of the base (identical weights)") == 2
    code, out, _ = invoke("show", "--store", str(store))
    assert out.count("a copy of the base") == 2
    code, _, err = invoke("neighbors", str(copies[0]), "--store", str(store))
    assert code == 2 and "its weights are the base's (a copy of the base)" in err
    near = modelvec.neighbors(zoo[0], store=store, k=10)
    assert not {str(c.resolve()) for c in copies} & set(near.nearest["model"])


# --- 7: an adapter is embedded on the model its config names ----------------------------------------------------


def test_an_adapter_is_embedded_on_the_model_its_config_names_or_refused(base, tmp_path):
    ft = finetune(base, tmp_path / "ft", 0, 1)
    on_ft = lora(ft, tmp_path / "on-ft", seed=3)
    nowhere = lora(ft, tmp_path / "nowhere", seed=4, names="/home/someone/checkpoints/ft-77")
    on_base = lora(base, tmp_path / "on-base", seed=5, names="/elsewhere/" + base.name)  # the trainer's copy
    store = tmp_path / "s.duckdb"
    result = modelvec.embed(base, [ft, on_ft, nowhere, on_base], store=store, load=False)
    assert list(result.failed) == [str(nowhere.resolve())]
    assert result.failed[str(nowhere.resolve())] == (
        f"{nowhere.resolve()}: its adapter_config.json names /home/someone/checkpoints/ft-77 as the model it adapts, "
        f"which is not the base ({base.resolve()}) nor a model found on this machine, in the store or on the Hub: "
        "embed it with that model as the base, or write the base's folder or id in base_model_name_or_path"
    )
    with Store(store, read_only=True) as db:
        parents = dict(db.con.execute("SELECT model, parent FROM traces").fetchall())
    assert parents[str(on_ft.resolve())] == str(ft.resolve()) and parents[str(on_base.resolve())] is None


def test_an_adapter_on_a_fine_tune_named_by_hub_id_beside_it_is_embedded_on_it(base, tmp_path):
    """The case of the issue: both named by Hub id in one ``embed``; the adapter's config names the fine-tune."""
    from modelvec.hub.client import HubSettings
    from modelvec.testing.localhub import LocalHub

    ft = finetune(base, tmp_path / "ft", 0, 1)
    on_ft = lora(ft, tmp_path / "on-ft", seed=3, names="u/ft")
    lost = lora(ft, tmp_path / "lost", seed=4, names="u/not-on-the-hub")
    hub = LocalHub(tmp_path / "hub")
    hub.publish("org/base", {p.name: p for p in base.iterdir()})
    hub.publish("u/ft", {p.name: p for p in ft.iterdir()})
    hub.publish("u/on-ft", {p.name: p for p in on_ft.iterdir()})
    hub.publish("u/lost", {p.name: p for p in lost.iterdir()})
    store = tmp_path / "s.duckdb"
    with hub.serve() as server:
        settings = HubSettings(endpoint=server.endpoint, cache_dir=str(tmp_path / "hf"), token=False, backoff=0.01)
        result = modelvec.embed("org/base", ["u/ft", "u/on-ft", "u/lost"], store=store, hub_settings=settings)
    same = lora(ft, tmp_path / "same-on-ft", seed=3)  # the same adapter, its config naming the fine-tune's folder
    local = modelvec.embed(base, [ft, same], store=tmp_path / "local.duckdb", load=True)
    assert list(result.failed) == ["u/lost"] and "its parent u/not-on-the-hub" in result.failed["u/lost"]
    with Store(store, read_only=True) as db:
        assert db.con.execute("SELECT parent FROM traces WHERE model = 'u/on-ft'").fetchone()[0] == "u/ft"
    mine = result.metadata.set_index("model")
    row = mine.index.get_loc("u/on-ft")
    there = local.metadata.set_index("model").index.get_loc(str(same.resolve()))
    np.testing.assert_allclose(result.vectors[row], local.vectors[there], rtol=1e-5, atol=1e-6)


def test_an_adapter_named_by_hub_id_on_a_fine_tune_with_the_base_in_a_folder_is_embedded_on_it(
    base, tmp_path, monkeypatch
):
    """Issue 47, 9: the base kept in a folder (downloaded once), the fine-tune and its adapter named by Hub id, the
    adapter's config naming the fine-tune's id: embedded on it, placed under it in the tree, its vector the one a
    local embed gives; offline, with the fine-tune stored by an earlier run, the same."""
    from modelvec.hub.client import HubSettings
    from modelvec.report.tree import model_tree
    from modelvec.testing.localhub import LocalHub

    ft = finetune(base, tmp_path / "ft", 0, 1)
    on_ft = lora(ft, tmp_path / "on-ft", seed=3, names="u/ft")
    hub = LocalHub(tmp_path / "hub")
    hub.publish("u/ft", {p.name: p for p in ft.iterdir()})
    hub.publish("u/on-ft", {p.name: p for p in on_ft.iterdir()})
    store = tmp_path / "s.duckdb"
    with hub.serve() as server:
        settings = HubSettings(endpoint=server.endpoint, cache_dir=str(tmp_path / "hf"), token=False, backoff=0.01)
        result = modelvec.embed(base, ["u/ft", "u/on-ft"], store=store, hub_settings=settings)
        stored = modelvec.embed(base, ["u/ft"], store=tmp_path / "t.duckdb", hub_settings=settings, load=False)
    assert result.failed == {} and sorted(result.embedded) == ["u/ft", "u/on-ft"] and stored.failed == {}
    by = {n.model: n for n in model_tree(base, store=store).nodes}
    assert (by["u/on-ft"].kind, by["u/on-ft"].parent) == ("adapter", "u/ft")
    same = lora(ft, tmp_path / "same-on-ft", seed=3)  # the same adapter, its config naming the fine-tune's folder
    local = modelvec.embed(base, [ft, same], store=tmp_path / "local.duckdb", load=True)
    there = local.metadata.set_index("model").index.get_loc(str(same.resolve()))
    mine = result.metadata.set_index("model").index.get_loc("u/on-ft")
    np.testing.assert_allclose(result.vectors[mine], local.vectors[there], rtol=1e-5, atol=1e-6)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # no Hub: the fine-tune stored before
    offline = HubSettings(cache_dir=str(tmp_path / "hf"), token=False)
    later = modelvec.embed(base, [on_ft], store=tmp_path / "t.duckdb", hub_settings=offline, load=False)
    assert later.failed == {} and later.embedded == [str(on_ft.resolve())]


# --- the fault harness ----------------------------------------------------------------------------------------

FILES = ("store", "vectors", "products", "spread", "tree", "map", "pairs", "blocks")


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.sampled_from(FILES), where=st.floats(0, 1), length=st.integers(1, 16), value=st.integers(0, 255))
def test_any_byte_range_damaged_in_any_kept_file_is_the_same_answer_or_one_line(
    kept, base, zoo, tmp_path_factory, which, where, length, value
):
    """Every file the store keeps, a seeded byte range overwritten: each command answers as on the undamaged store,
    or says what was damaged in one line (``error:``, ``left out:``) with a non-zero status; never a traceback, a
    bug's status or exit 0 with another answer."""
    root, _, first = kept
    here = tmp_path_factory.mktemp("damaged")
    store = copy_store(root, here)
    files = kept_files(store, base)
    mark = {"spread": ".spread-", "tree": ".tree.", "map": ".map-", "pairs": ".pairs-", "blocks": ".blocks-"}
    path = files[which] if which in files else next(p for name, p in files.items() if mark[which] in name)
    size = path.stat().st_size
    offset = min(int(where * size), size - 1)
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(bytes([value]) * min(length, size - offset))
    for command, (code, out, err) in answers(store, base, zoo[0], here / "out").items():
        assert "Traceback" not in out + err and code in (0, 1, 2), (command, code, err)
        if code == 0:
            assert answer(out) == answer(first[command][1]), (which, offset, command, err)
            continue
        lines = err.strip().splitlines()
        assert lines and all(line.startswith(("error:", "left out:", "note:")) for line in lines), (command, err)
        named = [line for line in lines if not line.startswith("note:")]
        assert named and all(path.name in line for line in named), (which, command, err)


def test_the_tree_is_kept_beside_the_store_and_inferred_again_when_what_it_came_from_changes(kept, base, zoo, tmp_path):
    """A later tree (or a neighbour query's place, at any size) reads the tree kept for exactly these traces and
    cards; a model added, or the kept file damaged, and it is inferred again."""
    from unittest import mock

    from modelvec.report import tree as report_tree

    root, _, first = kept
    store = copy_store(root, tmp_path)
    with mock.patch.object(report_tree, "infer_tree", side_effect=AssertionError("inferred again")):
        code, out, err = invoke("tree", str(base), "--store", str(store), "--json")
        assert code == 0 and answer(out) == answer(first["tree"][1]), err
        near = modelvec.neighbors(zoo[0], store=store)
        assert near.tree is not None and near.tree["model"] == str(zoo[0].resolve())
    path = next(p for name, p in kept_files(store, base).items() if ".tree." in name)
    with open(path, "r+b") as fh:
        fh.seek(60)
        fh.write(b"##")
    code, out, err = invoke("tree", str(base), "--store", str(store), "--json")
    assert code == 0 and answer(out) == answer(first["tree"][1])
    assert err.startswith(f"note: {path}") and "inferred again" in err
    modelvec.embed(base, [finetune(base, tmp_path / "added", 2, 99)], store=store, load=False)
    with mock.patch.object(report_tree, "infer_tree", side_effect=AssertionError("inferred again")):
        code, _, err = invoke("tree", str(base), "--store", str(store), "--json")
    assert code == 3 and "inferred again" in err  # the added model's trace is not in the kept tree: inferred again


# --- the nearest lists kept beside the store (cluster --neighbours lists) ------------------------------


def lists_answers(store: Path, base: Path, query: Path, out: Path) -> dict[str, tuple[int, str, str]]:
    """``cluster`` and ``neighbors`` on the nearest lists (``--neighbours lists``), as :func:`answers` gives them."""
    with maps_not_drawn() as maps:
        code, out_, err = invoke(
            "cluster", str(base), "--store", str(store), "--out", str(out), "--json", "--neighbours", "lists"
        )
    if code == 0:
        out_ = json.dumps({**json.loads(out_), "map": maps[0]})
    return {
        "cluster": (code, out_, err),
        "neighbors": invoke("neighbors", str(query), "--store", str(store), "--json", "--neighbours", "lists"),
    }


@pytest.fixture(scope="module")
def listed(kept, base, zoo, tmp_path_factory):
    """The kept store with its nearest lists and landmarks kept too, and the answers read from them."""
    root = tmp_path_factory.mktemp("listed")
    store = copy_store(kept[0], root)
    first = lists_answers(store, base, zoo[0], root / "out")
    assert all(code == 0 and "note:" not in err for code, _, err in first.values()), first
    return root, store, first


@pytest.mark.parametrize("what", [".landmarks.", ".nearest-"])
@pytest.mark.parametrize("damage", ["a flipped byte", "cut short", "the header", "another store's", "fewer models'"])
def test_kept_nearest_lists_damaged_or_not_these_are_computed_again(listed, base, zoo, tmp_path, what, damage):
    """A kept nearest-lists or landmarks file damaged, cut short, from another store or from a store of fewer models:
    the answers are the same, the damage said in one line (a file of other vectors is no damage: only the rows it
    cannot answer are computed, silently)."""
    root, _, first = listed
    store = copy_store(root, tmp_path)
    path = next(p for name, p in kept_files(store, base).items() if what in name)
    if damage in ("another store's", "fewer models'"):
        other = tmp_path / "other" / "s.duckdb"
        other.parent.mkdir()
        models = zoo[:6] if damage == "fewer models'" else list(reversed(zoo[:8]))
        assert not modelvec.embed(base, models, store=other, load=False).failed
        lists_answers(other, base, zoo[0], tmp_path / "other-out")
        shutil.copy(next(p for name, p in kept_files(other, base).items() if what in name), path)
    elif damage == "cut short":
        with open(path, "r+b") as fh:
            fh.truncate(path.stat().st_size - 7)
    elif damage == "the header":
        with open(path, "r+b") as fh:
            fh.seek(40)
            fh.write(b"!")
    else:
        with open(path, "r+b") as fh:
            fh.seek(path.stat().st_size - 3)
            byte = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([byte[0] ^ 0x10]))
    again = lists_answers(store, base, zoo[0], tmp_path / "out")
    for command in ("cluster", "neighbors"):
        code, out, err = again[command]
        assert code == 0 and answer(out) == answer(first[command][1]), (command, err)
    said = again["cluster"][2]
    if damage in ("another store's", "fewer models'"):
        assert "note:" not in said
    else:
        assert said.count("\n") == 1 and said.startswith(f"note: {path}") and "computed again" in said, said
    assert "note:" not in lists_answers(store, base, zoo[0], tmp_path / "out")["cluster"][2]  # kept again, whole


def test_a_model_not_stored_is_placed_by_walking_the_kept_lists(listed, base, tmp_path):
    """``neighbors`` of a model that is not stored, where the lists are kept: found by walking them (said in one
    line), the nearest and the prediction the comparison with every stored vector gives; a damaged vector it reaches is left out and
    named."""
    root, _, _ = listed
    query = finetune(base, tmp_path / "new-news", 0, 77)
    store = copy_store(root, tmp_path)
    args = ("--store", str(store), "--json", "--neighbours", "lists")
    code, walked, err = invoke("neighbors", str(query), *args)
    assert code == 0 and err.count("\n") == 1 and "walking the kept nearest lists" in err, err
    (tmp_path / "scanned").mkdir()
    scanned = copy_store(root, tmp_path / "scanned")
    next(p for name, p in kept_files(scanned, base).items() if ".nearest-" in name).unlink()
    code, out, err = invoke("neighbors", str(query), "--store", str(scanned), "--json", "--neighbours", "lists")
    assert code == 0 and "walking" not in err
    walk, scan = json.loads(walked), json.loads(out)
    assert [r["model"] for r in walk["nearest"]] == [r["model"] for r in scan["nearest"]]
    assert (walk["predicted"], walk["votes"]) == (scan["predicted"], scan["votes"])
    # the walk's products in float64 from the float32 vectors, the scan's in float32
    assert np.allclose([r["distance"] for r in walk["nearest"]], [r["distance"] for r in scan["nearest"]], rtol=1e-6)
    nearest = json.loads(walked)["nearest"][0]["model"]
    with Store(store, read_only=True) as db:
        offset = db.con.execute('SELECT "offset" FROM vectors WHERE model = ?', [nearest]).fetchone()[0]
    with open(f"{store}.vectors", "r+b") as fh:
        fh.seek(offset + 12)
        fh.write(b"\x01\x02\x03")
    code, out, err = invoke("neighbors", str(query), *args)
    assert code == 1 and f"left out: {nearest}: its stored vector" in err, err
    assert nearest not in [row["model"] for row in json.loads(out)["nearest"]]


def test_lists_of_each_ranking_are_kept_side_by_side(listed, base, tmp_path):
    """Lists ranked by distance alone (``--scaling none``) are kept beside those by mutual proximity, not over them:
    the default's answer afterwards is read from its own kept file, left as it was."""
    root, _, first = listed
    store = copy_store(root, tmp_path)
    ranked = next(p for name, p in kept_files(store, base).items() if ".nearest-" in name)
    before = ranked.read_bytes()
    args = ("cluster", str(base), "--store", str(store), "--out", str(tmp_path / "o"), "--json")
    args += ("--neighbours", "lists")
    with maps_not_drawn():
        code, _, err = invoke(*args, "--scaling", "none")
    assert code == 0 and "note:" not in err, err
    assert len([name for name in kept_files(store, base) if ".nearest-" in name]) == 2
    with maps_not_drawn():
        code, out, _ = invoke(*args)
    assert code == 0 and json.loads(out)["knn_score"] == json.loads(first["cluster"][1])["knn_score"]
    assert ranked.read_bytes() == before


def test_kept_lists_ranked_for_a_few_rows_are_those_rows_of_every_row_ranked(listed, base):
    """What ``neighbors`` of a stored model reads (its own row and the landmarks', ranked by the exact spreads) is
    those rows of the lists ranked whole."""
    from modelvec import Representation
    from modelvec.store import Population
    from modelvec.store.views.listed import kept_lists

    _, store, _ = listed
    path = next(p for name, p in kept_files(store, base).items() if ".nearest-" in name)
    ranking = read_cache_file(path).meta["ranking"]
    with Store(store, read_only=True) as db:
        pop = Population(db, str(base), Representation())
        whole, exact = kept_lists(pop, "cosine", ranking)
        rows = np.array([2, 7])
        some, same = kept_lists(pop, "cosine", ranking, rows)
    assert exact is not None and np.array_equal(exact[0], same[0])
    assert json.loads(ranking)[0] == "mutual-proximity" and set(some) == set(whole)
    for name in whole:
        for i in range(len(whole[name])):
            a, b = whole[name].row(i), some[name].row(i)
            if i in rows or name not in read_cache_file(path).meta["ranked"]:
                assert all(np.array_equal(x, y) for x, y in zip(a, b)), (name, i)
            else:
                assert len(b[0]) == 0
