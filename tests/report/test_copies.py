"""What people upload beside fine-tunes, answered as the same models: re-saves in float16, bfloat16 and float32 of a
base and of fine-tunes, byte copies (mirrors), one model given two ways, edited cards (issue 47).

A re-save or a copy is never a fine-tune, never a parent, never a point on the map nor a count in a score; its
original is the base, else the one the cards name, else the one made first, else the finer dtype; one model given
under two names is stored once; a card edited since is read again by the next embed, which every report then reads.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import modelvec
from builders import PLANTED_DATASETS, cli_json, planted_dataset_finetune, save_state
from modelvec.report.tree import model_tree
from modelvec.store import Population, Store


def cli_text(*args: str) -> str:
    """What ``modelvec ARGS`` prints (both streams), which must succeed."""
    from typer.testing import CliRunner

    from modelvec.cli import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def resave(src: Path, dst: Path, dtype: torch.dtype, card: dict | None = None, *, when: float | None = None) -> Path:
    """``src``'s weights loaded and saved again in ``dtype`` (as a re-upload in another precision is made), with a
    card; ``when``: the weights file's time (later than the original's, as a re-upload's is)."""
    state = load_file(str(src / "model.safetensors"))
    save_state(dst, {k: v.to(dtype) for k, v in state.items()}, json.loads((src / "config.json").read_text()))
    if card is not None:
        (dst / "README.md").write_text(f"---\n{json.dumps(card)}\n---\n")
    if when is not None:
        os.utime(dst / "model.safetensors", (when, when))
    return dst


@pytest.fixture(scope="module")
def zoo(tiny_bert, tmp_path_factory) -> tuple[Path, list[Path]]:
    """Three fine-tunes on each of two datasets (float32), their files a day old."""
    root = tmp_path_factory.mktemp("copies")
    base = shutil.copytree(tiny_bert, root / "base")
    made = [planted_dataset_finetune(base, root / f"ft{d}{i}", d, 10 * d + i) for d in range(2) for i in range(3)]
    for m in made:
        day_ago = (m / "model.safetensors").stat().st_mtime - 86400
        os.utime(m / "model.safetensors", (day_ago, day_ago))
    return base, made


def _cluster(base: Path, store: Path, out: Path) -> dict:
    return cli_json("cluster", str(base), "--store", str(store), "--out", str(out), "--reduce", "pca")


def test_re_saves_are_copies_never_fine_tunes_and_leave_every_score_as_it_was(zoo, tmp_path):
    base, made = zoo
    b16 = resave(base, tmp_path / "base-fp16", torch.float16)
    bf = resave(
        made[0], tmp_path / "ft00-bf16", torch.bfloat16, {"base_model": "ft00", "base_model_relation": "quantized"}
    )
    up = resave(resave(made[3], tmp_path / "ft10-bf16", torch.bfloat16), tmp_path / "ft10-bf16-fp32", torch.float32)
    alone, mixed = tmp_path / "alone.duckdb", tmp_path / "mixed.duckdb"
    assert modelvec.embed(base, made, store=alone, load=False).failed == {}
    assert modelvec.embed(base, [*made, b16, bf, up.parent / "ft10-bf16", up], store=mixed, load=False).failed == {}
    first, second = _cluster(base, alone, tmp_path / "a"), _cluster(base, mixed, tmp_path / "m")
    assert second["n_models"] == first["n_models"] == 6 and second["knn_score"] == first["knn_score"] == 1.0
    assert second["population"]["copies"] == [str(b16)]
    of_models = second["population"]["copies_of_models"]
    assert of_models[str(bf)] == {
        "model": str(bf),
        "original": str(made[0]),
        "exact": False,
        "precision": "bfloat16",
        "chosen_by": "named by their cards",
    }
    # a bfloat16 re-save of ft10 and a float32 re-save of that (the same numbers): both copies of ft10, made first
    for copy in (up.parent / "ft10-bf16", up):
        assert (of_models[str(copy)]["original"], of_models[str(copy)]["chosen_by"]) == (str(made[3]), "created first")
    tree = model_tree(base, store=mixed)
    by = {Path(n.model).name: n for n in tree.nodes}
    alone_tree = {Path(n.model).name: n for n in model_tree(base, store=alone).nodes}
    assert (by["base-fp16"].kind, by["base-fp16"].parent, by["base-fp16"].resaved) == ("copy", str(base), "float16")
    assert (by["ft00-bf16"].kind, by["ft00-bf16"].parent, by["ft00-bf16"].resaved) == ("copy", str(made[0]), "bfloat16")
    assert by["ft00-bf16"].agrees  # its card says a quantization of ft00: what the Hub calls a dtype re-save
    copies = {n.model for n in tree.nodes if n.kind == "copy"}
    assert not any(p in copies for n in tree.nodes for p in n.parents)  # a copy is nobody's parent
    for m in (m.name for m in made):  # every fine-tune placed as it is without the re-saves
        assert (by[m].kind, by[m].parents) == (alone_tree[m].kind, alone_tree[m].parents)


def test_identical_weights_the_original_is_the_one_the_cards_name_and_a_merge_keeps_its_parents(zoo, tmp_path):
    """A byte copy whose name sorts first, its card naming the original; a merge of the original and another
    fine-tune, its card naming both: the copy is the copy, the merge's card is right."""
    base, made = zoo
    original, other = made[0], made[3]
    mirror = shutil.copytree(original, tmp_path / "a-mirror")  # sorts before ft00
    (mirror / "README.md").write_text(f"---\nbase_model: {original}\ndatasets:\n- {PLANTED_DATASETS[0]}\n---\n")
    a, b = load_file(str(original / "model.safetensors")), load_file(str(other / "model.safetensors"))
    merge = save_state(
        tmp_path / "merge", {k: (a[k] + b[k]) / 2 for k in a}, json.loads((original / "config.json").read_text())
    )
    (merge / "README.md").write_text(f"---\nbase_model: [{original}, {other}]\nbase_model_relation: merge\n---\n")
    store = tmp_path / "s.duckdb"
    result = modelvec.embed(base, [*made, mirror, merge], store=store, load=False)
    assert result.failed == {}
    assert result.same_weights == {str(mirror): str(original)}  # embed says so
    by = {n.model: n for n in model_tree(base, store=store).nodes}
    node = by[str(mirror)]
    assert (node.kind, node.copy_of, node.resaved, node.original_by) == (
        "copy",
        str(original),
        None,
        "named by their cards",
    )
    assert by[str(original)].kind != "copy" and by[str(original)].copy_of is None
    assert by[str(merge)].kind == "merge" and set(by[str(merge)].parents) == {str(original), str(other)}
    assert by[str(merge)].agrees
    report = _cluster(base, store, tmp_path / "o")
    assert report["n_models"] == 7 and str(mirror) in report["population"]["copies_of_models"]
    near, of_original = modelvec.neighbors(mirror, store=store, k=3), modelvec.neighbors(original, store=store, k=3)
    assert near.query == str(mirror) and near.nearest["model"].tolist() == of_original.nearest["model"].tolist()
    assert near.notes[0].startswith(f"{mirror} is a copy of {original} (identical weights): off the map")
    assert near.tree["kind"] == "copy" and near.tree["copy_of"] == str(original)


def test_a_byte_copy_made_later_is_the_copy_whatever_its_name(zoo, tmp_path):
    """No card names either: the one made first is the original (a mirror is uploaded after), and it says so."""
    base, made = zoo
    mirror = tmp_path / "a-later-mirror"
    shutil.copytree(made[1], mirror, copy_function=shutil.copy)  # a fresh file: made now, a day after
    (mirror / "README.md").unlink(missing_ok=True)
    store = tmp_path / "s.duckdb"
    modelvec.embed(base, [*made, mirror], store=store, load=False)
    with Store(store, read_only=True) as db:
        found = Population(db, base).copies
    assert list(found) == [str(mirror)] and found[str(mirror)].original == str(made[1])
    assert found[str(mirror)].chosen_by == "created first" and found[str(mirror)].exact


def test_one_model_given_two_ways_is_one_row_and_counted_once(zoo, tmp_path):
    base, made = zoo
    store = tmp_path / "s.duckdb"
    result = modelvec.embed(base, [*made, made[2] / "model.safetensors"], store=store, load=False)
    assert result.aliases == {str(made[2] / "model.safetensors"): str(made[2])}
    again = modelvec.embed(base, [os.path.relpath(made[4] / "model.safetensors")], store=store, load=False)
    assert again.embedded == [] and again.aliases == {str(made[4] / "model.safetensors"): str(made[4])}
    report = _cluster(base, store, tmp_path / "o")
    assert report["n_models"] == 6 and report["knn_score"] == 1.0
    shown = cli_json("show", "--store", str(store))
    assert sorted({m["model"] for m in shown["models"]}) == sorted(str(m) for m in made)
    with Store(store, read_only=True) as db:
        assert db.reads.aliases() == {**result.aliases, **again.aliases}
    near = modelvec.neighbors(made[2] / "model.safetensors", store=store, k=3)
    assert near.query == str(made[2]) and not near.on_the_fly  # the alias asked about: the stored model it names
    text = cli_text("embed", "--base", str(base), str(made[5] / "model.safetensors"), "--store", str(store))
    assert "model.safetensors: the same weight files as " in text and "one model, stored once" in text


def test_an_edited_card_is_read_again_and_every_report_reads_the_new_labels(zoo, tmp_path):
    base, made = zoo
    models = [shutil.copytree(m, tmp_path / m.name) for m in made]
    store = tmp_path / "s.duckdb"
    modelvec.embed(base, models, store=store, load=False)
    card = models[0] / "README.md"
    card.write_text(f"---\nbase_model: {base}\nbase_model_relation: adapter\ndatasets:\n- beta\n---\n")
    result = modelvec.embed(base, models, store=store, load=False)
    assert result.embedded == [] and len(result.skipped) == 6
    assert result.notes[next(k for k in result.notes if "cards changed" in k)] == [f"{models[0]}: imdb -> beta"]
    report = _cluster(base, store, tmp_path / "o")
    assert report["per_dataset"]["imdb"]["count"] == 2  # cluster scores against the card as it is now: ft00 is beta
    with Store(store, read_only=True) as db:
        stored = dict(zip(db.reads.metadata()["model"], db.reads.metadata()["datasets"]))
        assert list(stored[str(models[0])]) == ["beta"]
    node = {n.model: n for n in model_tree(base, store=store).nodes}[str(models[0])]
    assert node.declared_relation == "adapter" and not node.agrees  # the tree reads the card embed read
    unchanged = modelvec.embed(base, models, store=store, load=False)
    assert not any("cards changed" in k for k in unchanged.notes)  # read again, unchanged: nothing said


def test_show_rank_and_evaluate_read_the_population_copies_left_out(zoo, tmp_path):
    base, made = zoo
    b16 = resave(base, tmp_path / "base-fp16", torch.float16)
    bf = resave(made[1], tmp_path / "ft01-bf16", torch.bfloat16)
    store = tmp_path / "s.duckdb"
    modelvec.embed(base, [*made, b16, bf], store=store, load=False)
    states = {m["model"]: m["state"] for m in cli_json("show", "--store", str(store))["models"]}
    assert states[str(b16)] == "a float16 re-save of the base (equal up to rounding)"
    assert states[str(bf)] == f"a bfloat16 re-save of {made[1]} (equal up to rounding)"
    assert all(states[str(m)] is None for m in made)
    from modelvec.studies.depth import over_stored

    study = over_stored(str(base), store=store)
    assert study.n_models == 6 and any("re-saved in another dtype" in n for n in study.notes)


def test_a_bf16_base_and_fine_tune_re_saved_by_transformers_in_float32_and_float16(llama_family, tmp_path):
    """A bfloat16 Llama base re-saved in float32 (exact: a copy of the base), a long fine-tune of it re-saved in
    float16 (its made-first original kept): transformers' own round trips, as re-uploads are made."""
    from transformers import LlamaForCausalLM

    base, a, b, c = llama_family
    LlamaForCausalLM.from_pretrained(base, dtype=torch.float32).save_pretrained(tmp_path / "base-fp32")
    LlamaForCausalLM.from_pretrained(a, dtype=torch.float16).save_pretrained(tmp_path / "a-fp16")
    for path in (a, b, c):  # the originals were made before the re-uploads
        for file in path.glob("*.safetensors"):
            os.utime(file, (file.stat().st_mtime - 3600,) * 2)
    store = tmp_path / "s.duckdb"
    assert modelvec.embed(base, [a, b, c, tmp_path / "base-fp32", tmp_path / "a-fp16"], store=store).failed == {}
    by = {Path(n.model).name: n for n in model_tree(base, store=store).nodes}
    assert (by["base-fp32"].kind, by["base-fp32"].copy_of, by["base-fp32"].resaved) == ("copy", str(base), None)
    assert (by["a-fp16"].kind, by["a-fp16"].copy_of, by["a-fp16"].original_by) == ("copy", str(a), "created first")
    assert {m: (by[m].kind, by[m].parent) for m in ("a", "b", "c")} == {m: ("fine-tune", str(base)) for m in "abc"}


def test_a_hub_model_whose_new_commit_only_edits_its_card_keeps_its_vector_and_takes_the_new_labels(zoo, tmp_path):
    """A Hub fine-tune's card edited on the Hub (a new commit, the weights as they were): the next embed fetches no
    weights, moves the stored version to the new commit and reads the new labels; a commit that changes the
    weights is embedded again."""
    from modelvec.hub.client import HubSettings
    from modelvec.testing.localhub import LocalHub

    base, made = zoo
    hub = LocalHub(tmp_path / "hub")
    weights = {p.name: p for p in made[0].iterdir() if p.name != "README.md"}
    first = hub.publish("u/ft", {**weights, "README.md": b"---\ndatasets:\n- imdb\n---\n"})
    store = tmp_path / "s.duckdb"
    with hub.serve() as server:
        settings = HubSettings(endpoint=server.endpoint, cache_dir=str(tmp_path / "hf"), token=False, backoff=0.01)
        assert modelvec.embed(base, ["u/ft"], store=store, hub_settings=settings, load=False).embedded == ["u/ft"]
        second = hub.publish("u/ft", {**weights, "README.md": b"---\ndatasets:\n- beta\n---\n"})
        again = modelvec.embed(base, ["u/ft"], store=store, hub_settings=settings, load=False)
        assert again.embedded == [] and again.skipped == ["u/ft"]
        with Store(store, read_only=True) as db:
            row = db.reads.metadata().set_index("model").loc["u/ft"]
        assert row["model_hash"] == f"git:{second}" != f"git:{first}" and list(row["datasets"]) == ["beta"]
        other = {**weights, "model.safetensors": made[1] / "model.safetensors"}
        hub.publish("u/ft", {**other, "README.md": b"---\ndatasets:\n- beta\n---\n"})
        assert modelvec.embed(base, ["u/ft"], store=store, hub_settings=settings, load=False).embedded == ["u/ft"]


def test_a_fine_tune_of_a_few_bf16_steps_is_no_re_save_of_the_base(zoo, tmp_path):
    """Fine-tunes saved in bfloat16 whose deltas are as small as bf16's rounding (a step or two): as near the base as
    a bfloat16 re-save of it is, but their entries are not the base's rounded: fine-tunes, on the map; the re-save
    beside them is the copy."""
    base, made = zoo
    state = load_file(str(base / "model.safetensors"))
    config = json.loads((base / "config.json").read_text())
    short = []
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        moved = {}
        for key, w in state.items():
            if w.ndim == 2 and ".layer." in key:  # a fifth of a bf16 step per entry: a fifth of the entries cross one
                ulp = torch.finfo(torch.bfloat16).eps * w.abs().clamp_min(1e-12)
                w = w + 0.15 * ulp * torch.randn(w.shape, generator=g)
            moved[key] = w.to(torch.bfloat16)
        short.append(save_state(tmp_path / f"short{seed}", moved, config))
    resaved = resave(base, tmp_path / "base-bf16", torch.bfloat16)
    store = tmp_path / "s.duckdb"
    assert modelvec.embed(base, [*made, *short, resaved], store=store, load=False).failed == {}
    with Store(store, read_only=True) as db:
        pop = Population(db, base)
        traces = db.reads.traces(pop.name, pop.representation.key(), pop.base_hash, read=False).frame.set_index("model")
    assert list(pop.copies) == [str(resaved)] and pop.copies[str(resaved)].original == pop.name
    rounding = traces["rounding"] * traces["scale"]
    for m in short:  # as near the base as the re-save, within the rounding a re-save may leave
        assert traces.loc[str(m), "norm"] <= 1.5 * rounding[str(m)] and traces.loc[str(m), "zeros"] < 0.9


def test_a_card_naming_the_base_by_its_hub_id_agrees_where_the_base_is_a_hub_cache_snapshot(zoo, tmp_path):
    """The base given as its folder in the Hub's cache (downloaded once), a fine-tune's card naming it by Hub id: the
    card names the base, as the weights say; a card naming another id is flagged."""
    base, made = zoo
    snapshot = shutil.copytree(base, tmp_path / "hub" / "models--org--base" / "snapshots" / "0123abcd")
    right, wrong = shutil.copytree(made[0], tmp_path / "right"), shutil.copytree(made[1], tmp_path / "wrong")
    (right / "README.md").write_text("---\nbase_model: org/base\ndatasets:\n- imdb\n---\n")
    (wrong / "README.md").write_text("---\nbase_model: org/other\ndatasets:\n- imdb\n---\n")
    store = tmp_path / "s.duckdb"
    modelvec.embed(snapshot, [right, wrong, *made[3:]], store=store, load=False)
    by = {Path(n.model).name: n for n in model_tree(snapshot, store=store).nodes}
    assert by["right"].agrees and by["right"].declared_parents == [str(snapshot)] and not by["wrong"].agrees


def test_evaluate_scores_each_model_once_and_a_card_naming_only_its_parent_claims_no_kind(zoo, tmp_path):
    """``evaluate`` reads the vectors through the population (a re-save beside the fine-tunes is left out, scored once
    as its original); an adapter whose card names its parent without a relation agrees with the weights."""
    from builders import peft_adapter
    from modelvec.represent import Representation
    from modelvec.studies.compare import evaluate

    base, made = zoo
    copy = resave(made[4], tmp_path / "ft11-fp16", torch.float16)
    table = evaluate(
        base, [*made, copy], variants={"default": Representation()}, store=tmp_path / "e.duckdb", n_boot=10
    )
    assert set(table["n_scored"]) == {6}
    adapter = peft_adapter(made[0], tmp_path / "lora", seed=1)
    (adapter / "README.md").write_text(f"---\nbase_model: {made[0]}\n---\n")  # no base_model_relation
    store = tmp_path / "s.duckdb"
    modelvec.embed(base, [*made, adapter], store=store, load=False)
    node = {n.model: n for n in model_tree(base, store=store).nodes}[str(adapter)]
    assert (node.kind, node.parent, node.declared_relation, node.agrees) == ("adapter", str(made[0]), None, True)
