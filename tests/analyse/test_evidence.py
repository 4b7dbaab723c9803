"""Evidence that generalises: the split by dataset, bootstrap intervals, adapters beside full fine-tunes."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file
from transformers import BertModel

import modelvec
from builders import planted_dataset_finetune
from modelvec import Representation
from modelvec.analyse import clustering_scores
from modelvec.analyse.evaluation import REFERENCE, REFERENCE_BN
from modelvec.analyse.evidence import bootstrap_interval, mixed_scores, split_datasets
from modelvec.core.names import model_id
from modelvec.studies.compare import evaluate
from modelvec.studies.task_vectors import task_vector_gram

NAMES = [f"dataset-{c}" for c in "abcdefghi"]


def test_split_is_deterministic_and_disjoint_by_dataset():
    select, report = split_datasets(NAMES)
    assert not set(select) & set(report) and set(select) | set(report) == set(NAMES)
    assert len(select) == len(NAMES) // 2
    for seed in range(5):  # the order (and repetition) of the names does not matter
        shuffled = NAMES * 2
        random.Random(seed).shuffle(shuffled)
        assert split_datasets(shuffled) == (select, report)
    # a cut by hashed name, not by position: the sorted list's first half is not the selection
    assert select != sorted(NAMES)[: len(select)]
    assert split_datasets(NAMES, ["dataset-a", "dataset-i"]) == (["dataset-a", "dataset-i"], sorted(NAMES)[1:-1])
    with pytest.raises(ValueError, match="no model has: nope"):
        split_datasets(NAMES, ["dataset-a", "nope"])
    with pytest.raises(ValueError, match="at least 2 datasets in each half"):
        split_datasets(["x", "y", "z"])


def test_bootstrap_interval_covers_the_planted_mean():
    rng = np.random.default_rng(0)
    covered, widths = 0, []
    for trial in range(200):  # per-model scores of a planted mean 0.7: a 95 % interval covers it ~95 % of the time
        values = (rng.random(80) < 0.7).astype(float)
        lo, hi = bootstrap_interval(values, n_boot=1000, seed=trial)
        covered += lo <= 0.7 <= hi
        widths.append(hi - lo)
    assert 0.88 <= covered / 200 <= 0.99
    assert 0.15 < np.mean(widths) < 0.25  # about 2 x 1.96 x sqrt(0.21 / 80) = 0.20
    lo, hi = bootstrap_interval(np.array([0.5, np.nan, 0.5]))
    assert lo == hi == 0.5  # no spread, no interval; NaN (unscored models) ignored


def test_mixed_scores_separate_adapters_that_huddle_from_those_that_join_their_dataset():
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(3, 50))
    labels = [[f"d{d}"] for d in range(3) for _ in range(6)]
    is_adapter = [i % 6 >= 3 for i in range(18)]  # 3 full + 3 adapters per dataset
    X = np.array([centres[int(lab[0][1])] + 0.1 * rng.normal(size=50) for lab in labels])
    joined = mixed_scores(X, labels, is_adapter)
    assert joined.knn_full == joined.knn_adapters == joined.knn_mixed == joined.adapter_to_full == 1.0
    assert joined.n_adapters == 9
    huddled = X.copy()  # adapters: a shared direction dominates, their dataset's direction is faint
    offset = rng.normal(size=50)
    q, _ = np.linalg.qr(centres.T)
    offset -= q @ (q.T @ offset)  # orthogonal to the datasets' directions: it moves no full fine-tune nearer
    huddled[is_adapter] = 0.2 * huddled[is_adapter] + 3.0 * offset / np.linalg.norm(offset) * np.sqrt(50)
    got = mixed_scores(huddled, labels, is_adapter)
    assert got.knn_full == 1.0 and got.knn_adapters == 1.0  # each kind alone still sorts by dataset
    assert got.adapter_to_full == 1.0  # and the nearest full fine-tune is still the right one
    assert got.knn_mixed < 0.7  # but over both, adapters find each other first


def kinds_of_different_spread(seed: int, n_datasets: int = 7, per_kind: int = 3, dim: int = 20000):
    """What the evidence zoo's vectors look like (docs/evidence.md): full fine-tunes of a dataset
    share its direction strongly, but their noise lives in a smaller subspace, so their cosines to
    unrelated full fine-tunes spread wide; an adapter is mostly noise of its own, faintly along its
    dataset's direction (and an adapters-only one), so its cosines to everything are small and flat."""
    rng = np.random.default_rng(seed)
    direction, adapter_direction = rng.normal(size=(2, n_datasets, dim)) / np.sqrt(dim)
    X, labels, is_adapter = [], [], []
    for d in range(n_datasets):
        for i in range(2 * per_kind):
            if i < per_kind:
                noise = np.zeros(dim)
                noise[:2100] = rng.normal(size=2100) / np.sqrt(2100)
                X.append(0.45 * direction[d] + noise)
            else:
                X.append(0.12 * direction[d] + 0.17 * adapter_direction[d] + rng.normal(size=dim) / np.sqrt(dim))
            labels.append([f"d{d}"])
            is_adapter.append(i >= per_kind)
    return np.array(X), labels, is_adapter


def test_mutual_proximity_puts_kinds_of_different_spread_on_one_scale():
    missed_plain = missed_scaled = 0.0
    for seed in range(8):
        X, labels, is_adapter = kinds_of_different_spread(seed)
        plain = mixed_scores(X, labels, is_adapter)
        scaled = mixed_scores(X, labels, is_adapter, scaling="mutual-proximity")
        assert plain.knn_full == plain.knn_adapters == plain.adapter_to_full == 1.0  # each kind alone is sorted
        assert plain.knn_mixed < 1.0  # mixed, unrelated full fine-tunes outrank a full fine-tune's own adapters
        assert scaled.knn_full == scaled.knn_adapters == scaled.adapter_to_full == 1.0  # nothing lost
        assert scaled.knn_mixed >= plain.knn_mixed
        missed_plain += 1 - plain.knn_mixed
        missed_scaled += 1 - scaled.knn_mixed
    assert missed_scaled < 0.25 * missed_plain  # most of what mixing cost is recovered


def planted_adapter(base, out, dataset: int, seed: int):
    """A PEFT LoRA (q, v; r = 2, scaling 1) whose delta is the dataset's planted rank-2 delta of
    ``planted_dataset_finetune``, at a tenth of its scale, plus a little noise of its own."""
    model = BertModel.from_pretrained(base)
    peft_model = get_peft_model(
        model, LoraConfig(r=2, lora_alpha=2, target_modules=["query", "value"], init_lora_weights=False)
    )
    g_data = torch.Generator().manual_seed(1000 + dataset)  # the draws of planted_dataset_finetune, in its order
    planted = {}
    for key, value in sorted(load_file(str(base / "model.safetensors")).items()):
        if ".layer." in key and key.endswith(".weight") and value.ndim == 2:
            left, right = (
                torch.randn(value.shape[0], 2, generator=g_data),
                torch.randn(2, value.shape[1], generator=g_data),
            )
            planted[key.removesuffix(".weight")] = (left * 0.002 / (left @ right).norm(), right)
    g_model = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, module in peft_model.named_modules():
            if isinstance(module, LoraLayer):
                left, right = planted[name.removeprefix("base_model.model.")]
                module.lora_B["default"].weight.copy_(left + 1e-5 * torch.randn(left.shape, generator=g_model))
                module.lora_A["default"].weight.copy_(right)
    peft_model.save_pretrained(out)
    (out / "README.md").write_text(f"---\ndatasets:\n- planted-{dataset}\n---\n")
    return out


@pytest.fixture(scope="module")
def mixed_zoo(tiny_bert, tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    models = []
    for d in range(4):
        for i in range(2):
            full = planted_dataset_finetune(tiny_bert, root / f"full-{d}-{i}", d % 3, 100 * d + i)
            (full / "README.md").write_text(f"---\ndatasets:\n- planted-{d}\n---\n")
            models.append(full)
            models.append(planted_adapter(tiny_bert, root / f"lora-{d}-{i}", d % 3, 100 * d + 50 + i))
    return tiny_bert, models


def test_task_vector_gram_of_an_adapter_is_that_of_its_merged_model(tiny_bert, tmp_path):
    adapter = planted_adapter(tiny_bert, tmp_path / "lora", 0, 7)
    model = BertModel.from_pretrained(tiny_bert)
    from peft import PeftModel

    PeftModel.from_pretrained(model, adapter).merge_and_unload().save_pretrained(tmp_path / "merged")
    full = planted_dataset_finetune(tiny_bert, tmp_path / "full", 0, 3)
    via_adapter = task_vector_gram(tiny_bert, [adapter, full]).gram
    via_merged = task_vector_gram(tiny_bert, [tmp_path / "merged", full]).gram
    assert via_adapter[0, 0] > 0
    np.testing.assert_allclose(via_adapter, via_merged, rtol=1e-5)


def test_evaluate_splits_by_dataset_and_scores_adapters_beside_full_finetunes(mixed_zoo, tmp_path):
    base, models = mixed_zoo
    variants = {"sketch": Representation(rank=4)}
    table = evaluate(base, models, variants=variants, store=tmp_path / "s.duckdb", selection=["planted-0", "planted-3"])
    assert set(table["half"]) == {"selection", "report"}
    report = table[table["half"] == "report"].set_index("method")
    assert report.loc["sketch", "n_scored"] == 8  # planted-1 and planted-2: 2 full + 2 adapters each
    assert report.loc["sketch", "adapter_to_full"] == 1.0  # each adapter's nearest full fine-tune is its dataset's
    assert report.loc["sketch", "knn_full"] == 1.0
    lo, hi, knn = report.loc["sketch", ["knn_lo", "knn_hi", "knn_score"]]
    assert lo <= knn <= hi
    # planted-0 and planted-3 share their planted delta (d % 3): the selection half cannot tell them apart
    selection = table[table["half"] == "selection"].set_index("method")
    assert selection.loc[REFERENCE, "knn_score"] < report.loc[REFERENCE, "knn_score"]
    assert table[table["selected"]]["method"].unique().tolist() == ["sketch"]
    json.dumps(table.to_dict(orient="records"))  # the CLI's --json


def test_evaluate_scores_centred_variants(mixed_zoo, tmp_path):
    base, models = mixed_zoo
    table = evaluate(
        base,
        models,
        variants={"S": Representation(rank=4, factor="S")},
        store=tmp_path / "s.duckdb",
        split=False,
        center=True,
    )
    assert list(table["method"]) == [
        "S",
        "S + centred",
        REFERENCE,
        REFERENCE + " + centred",
        REFERENCE_BN,
        REFERENCE_BN + " + centred",
    ]
    assert set(table["half"]) == {"all"}
    rows = table.set_index("method")
    result = modelvec.embed(
        base, models, representation=Representation(rank=4, factor="S"), store=tmp_path / "s.duckdb"
    )
    X = result.vectors[[list(result.metadata["model"]).index(model_id(m)) for m in models]].astype(np.float64)
    labels = [list(d) for d in result.metadata.set_index("model").loc[[model_id(m) for m in models], "datasets"]]
    for name, vectors in (("S", X), ("S + centred", X - X.mean(axis=0))):
        assert rows.loc[name, "silhouette"] == pytest.approx(clustering_scores(vectors, labels)["silhouette"])
    assert rows.loc["S", "silhouette"] != pytest.approx(rows.loc["S + centred", "silhouette"])


def test_evaluate_scores_variants_with_mutual_proximity(mixed_zoo, tmp_path):
    base, models = mixed_zoo
    params = Representation(rank=4, factor="S")
    table = evaluate(
        base, models, variants={"S": params}, store=tmp_path / "s.duckdb", split=False, mutual_proximity=True
    )
    assert list(table["method"]) == [
        "S",
        "S + mutual proximity",
        REFERENCE,
        REFERENCE + " + mutual proximity",
        REFERENCE_BN,
        REFERENCE_BN + " + mutual proximity",
    ]
    rows = table.set_index("method")
    result = modelvec.embed(base, models, representation=params, store=tmp_path / "s.duckdb")
    X = result.vectors[[list(result.metadata["model"]).index(model_id(m)) for m in models]].astype(np.float64)
    labels = [list(d) for d in result.metadata.set_index("model").loc[[model_id(m) for m in models], "datasets"]]
    is_adapter = ["lora" in str(m) for m in models]
    for scaling, name in (("none", "S"), ("mutual-proximity", "S + mutual proximity")):
        mixed = mixed_scores(X, labels, is_adapter, scaling=scaling)
        assert rows.loc[name, "knn_score"] == pytest.approx(mixed.knn_mixed)
        assert rows.loc[name, "knn_adapters"] == pytest.approx(mixed.knn_adapters)
    # the clusterers see the vectors' own geometry: the same for both rows
    assert rows.loc["S + mutual proximity", "silhouette"] == rows.loc["S", "silhouette"]


def test_evaluate_command_prints_the_api_answer_with_a_split(mixed_zoo, tmp_path):
    from builders import TIMINGS, as_printed, cli_json
    from modelvec.studies.grid import variants
    from modelvec.studies.sweep import Sweep

    base, models = mixed_zoo
    store = tmp_path / "s.duckdb"
    table = evaluate(
        base, models, variants=variants(Sweep(rank=4)), store=store, selection=["planted-0", "planted-3"], center=True
    )
    args = ["--base", str(base), "--store", str(store), "--selection", "planted-0", "--selection", "planted-3"]
    rows = cli_json("evaluate", *map(str, models), *args, "--ranks", "4", "--center")
    drop = lambda rs: [{k: v for k, v in r.items() if k not in TIMINGS} for r in rs]
    assert drop(rows) == drop(as_printed(table.to_dict(orient="records")))
    assert len(rows) == 2 * 2 * (len(variants(Sweep(rank=4))) + 2)  # (variants + 2 references) x centred? x halves
    rows = cli_json("evaluate", *map(str, models), *args, "--rank", "4", "--mutual-proximity")
    assert len(rows) == 2 * 2 * (len(variants(Sweep(rank=4))) + 2)  # x scaled or not, instead
    assert sum(r["method"].endswith(" + mutual proximity") for r in rows) == len(rows) // 2
