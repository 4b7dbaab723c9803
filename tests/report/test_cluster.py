"""Clustering end to end: planted datasets through embed, the cluster report, neighbours, evaluate and the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import modelvec
from builders import PLANTED_DATASETS, planted_dataset_finetune
from modelvec import Checkpoint, Representation
from modelvec.analyse.evaluation import REFERENCE, REFERENCE_BN
from modelvec.analyse.scores import Scoring
from modelvec.cli import app
from modelvec.report import cluster, neighbors
from modelvec.report.nearest import IS_THE_BASE
from modelvec.store import Store
from modelvec.studies.compare import evaluate
from modelvec.studies.task_vectors import task_vector_gram


@pytest.fixture(scope="module")
def planted(tiny_bert, tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    models = [
        planted_dataset_finetune(tiny_bert, root / f"d{d}-m{i}", d, 10 * d + i) for d in range(3) for i in range(4)
    ]
    unlabelled = planted_dataset_finetune(tiny_bert, root / "mystery", 1, 99)
    (unlabelled / "README.md").unlink()
    store = root / "store.duckdb"
    result = modelvec.embed(tiny_bert, [*models, unlabelled], rank=4, store=store)
    assert not result.failed
    return tiny_bert, models, unlabelled, store


def test_task_vector_gram_is_the_inner_product_of_flattened_deltas(planted):
    base, models, _, _ = planted
    tv = task_vector_gram(base, models[:4])
    b, cks = Checkpoint(base), [Checkpoint(m) for m in models[:4]]
    layout = b.layout()
    flat = [
        torch.cat([(ck.matrix(r, ck.layout().prefix) - b.matrix(r, layout.prefix)).reshape(-1) for r in layout.refs])
        for ck in cks
    ]
    brute = torch.stack(flat).double()
    np.testing.assert_allclose(tv.gram, (brute @ brute.T).numpy(), rtol=1e-6)
    assert tv.dim == brute.shape[1]
    X = tv.embedding()
    np.testing.assert_allclose(X @ X.T, tv.gram, rtol=1e-6, atol=1e-12)


def test_planted_datasets_cluster_perfectly(planted, tmp_path):
    base, models, unlabelled, store = planted
    report = cluster(base, representation=Representation(rank=4), store=store, out=tmp_path, reduce="pca")
    assert report.knn_score == 1.0 and report.n_scored == 12
    assert set(report.per_dataset) == set(PLANTED_DATASETS)
    assert report.loo_accuracy == 1.0
    assert report.clustering["kmeans_ari"] == pytest.approx(1.0)
    [prediction] = report.predictions
    assert prediction["model"] == str(unlabelled.resolve()) and prediction["predicted"] == "glue/sst2"
    assert Path(report.files["png"]).read_bytes()[:4] == b"\x89PNG"
    assert "<html" in Path(report.files["html"]).read_text()[:2000].lower()


def test_the_map_is_given_the_model_tree_and_a_store_without_traces_gives_a_map_without_one(
    planted, tmp_path, monkeypatch
):
    import modelvec.report.tree as tree_report
    from modelvec.analyse.tree import Node, Tree
    from modelvec.core.errors import NothingStoredError

    base, _, _, store = planted
    asked: list[int] = []

    def made_up(pop, **_):  # the first model under the base, every other one an adapter on it
        names = list(pop.models["model"])
        asked.append(len(names))
        nodes = [Node(model=names[0], kind="fine-tune", parent=pop.name, parents=[pop.name], confidence=0.9)]
        nodes += [Node(model=m, kind="adapter", parent=names[0], parents=[names[0]], confidence=0.8) for m in names[1:]]
        return Tree(pop.name, nodes)

    monkeypatch.setattr(tree_report, "tree_of", made_up)
    report = cluster(base, representation=Representation(rank=4), store=store, out=tmp_path / "tree", reduce="pca")
    page = Path(report.files["html"]).read_text()
    assert asked == [13]  # the tree of every mapped model
    assert "colour by kind" in page and '"fine-tune (1)"' in page and '"adapter (12)"' in page  # the kinds' legend
    assert page.count('"adapter (confidence 0.80)"') == 4 * 12  # in the hover of each colouring's traces
    assert "tree edges on" in page  # 13 models: every edge may be drawn at once

    def untraced(pop, **_):
        raise NothingStoredError(pop.name, "no traces stored")

    monkeypatch.setattr(tree_report, "tree_of", untraced)
    report = cluster(base, representation=Representation(rank=4), store=store, out=tmp_path / "plain", reduce="pca")
    page = Path(report.files["html"]).read_text()
    assert "colour by kind" not in page and "tree edges" not in page and "colour by author" in page


def test_cluster_cli_json(planted, tmp_path):
    base, _, _, store = planted
    result = CliRunner().invoke(
        app,
        [
            "cluster",
            str(base),
            "--rank",
            "4",
            "--store",
            str(store),
            "--reduce",
            "pca",
            "--out",
            str(tmp_path),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in (
        "knn_score",
        "n_scored",
        "per_dataset",
        "metric",
        "pool",
        "silhouette",
        "kmeans_nmi",
        "kmeans_ari",
        "hdbscan_nmi",
        "hdbscan_ari",
        "loo_accuracy",
    ):
        assert key in data, key
    assert data["knn_score"] == 1.0 and data["metric"] == "cosine" and data["pool"] == "labelled"
    assert data["per_dataset"]["imdb"] == {"score": 1.0, "count": 4}
    table = CliRunner().invoke(
        app,
        [
            "cluster",
            str(base),
            "--rank",
            "4",
            "--store",
            str(store),
            "--reduce",
            "pca",
            "--out",
            str(tmp_path),
            "--pool",
            "all",
            "--metric",
            "euclidean",
        ],
    )
    assert table.exit_code == 0 and "kNN dataset score" in table.output and "PNG map" in table.output
    said = " ".join(table.output.split())
    assert "kmeans_nmi" not in said and "n_clustered" not in said  # scores in words, not the API's keys
    assert "k-means clusters vs datasets: adjusted Rand index" in said
    assert f"on the {int(data['n_clustered'])} models tuned on one dataset" in said
    assert " nan " not in said  # every score here is defined; an undefined one is explained, not printed
    assert "a vote of its 5 nearest" in said and "the vote:" not in said  # 4 a dataset: its own 3 can win 5 votes
    outvoted = CliRunner().invoke(
        app,
        ["cluster", str(base), "--rank", "4", "--store", str(store), "--reduce", "pca", "--out", str(tmp_path)]
        + ["--k", "6"],
    )
    said = " ".join(outvoted.output.split())
    assert outvoted.exit_code == 0 and "a vote of its 6 nearest" in said
    assert "the vote: a dataset has at most 3 other models here, no majority of 6 voters" in said and "--k 3" in said


def test_cluster_explains_missing_clustering_scores(planted, tmp_path):
    """One labelled dataset only (the others' labels dropped by source): the clustering scores are undefined,
    and the output says why instead of printing nan."""
    base, _, _, store = planted
    result = CliRunner().invoke(
        app,
        ["cluster", str(base), "--rank", "4", "--store", str(store), "--reduce", "pca", "--out", str(tmp_path)]
        + ["--label-source", "guessed"],
    )
    said = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "no clustering scores: they need two datasets" in said and "mutual information" not in said


def test_cluster_without_vectors_is_a_clear_error(planted, tmp_path):
    base, _, _, store = planted
    result = CliRunner().invoke(
        app, ["cluster", str(base), "--rank", "7", "--store", str(store), "--out", str(tmp_path)]
    )
    assert result.exit_code == 2 and "no vectors stored for this base with representation r7" in result.output


def test_neighbors_lists_the_same_dataset_first(planted):
    _, models, _, store = planted
    found = neighbors(models[0], representation=Representation(rank=4), store=store, scoring=Scoring(k=3))
    assert not found.on_the_fly
    assert [list(d) for d in found.nearest["datasets"]] == [["imdb"]] * 3
    assert str(models[0].resolve()) not in set(found.nearest["model"])
    assert found.nearest["distance"].is_monotonic_increasing
    assert (found.predicted, found.vote_share, found.votes) == ("imdb", 1.0, {"imdb": 3})
    assert found.closeness > 0.9 and found.confidence == found.closeness  # its neighbours are as near as any
    result = CliRunner().invoke(app, ["neighbors", str(models[5]), "--k", "3", "--rank", "4", "--store", str(store)])
    assert result.exit_code == 0 and "glue/sst2" in result.output
    assert "predicted dataset: glue/sst2 (confidence" in " ".join(result.output.split())
    assert "vote share 1.00" in " ".join(result.output.split())


def test_a_model_unlike_any_stored_is_predicted_without_confidence(planted, tmp_path):
    """Its neighbours' votes may be unanimous; they are farther from it than any stored model is from its own
    nearest, so the prediction says so (confidence 0), in the API and in words."""
    base, _, _, store = planted
    stranger = planted_dataset_finetune(base, tmp_path / "stranger", 0, 4242, noise=100.0)  # its own delta rules
    found = neighbors(stranger, representation=Representation(rank=4), store=store, scoring=Scoring(k=3))
    assert found.predicted is not None and found.vote_share > 0.5
    assert found.closeness < 0.1 and found.confidence < 0.1
    result = CliRunner().invoke(app, ["neighbors", str(stranger), "--k", "3", "--rank", "4", "--store", str(store)])
    said = " ".join(result.output.split())
    assert result.exit_code == 0 and "x closeness 0.0" in said and "neighbours are far" in said


def test_cluster_and_neighbors_rank_by_mutual_proximity_on_request(planted, tmp_path):
    from modelvec.analyse.scores import distance_matrix, knn_dataset_score

    base, models, _, store = planted
    params = Representation(rank=4)
    with modelvec.Store(store) as db:
        X, meta = db.reads.load(base=str(Path(base).resolve()), representation=params)
    labels = [list(d) for d in meta["datasets"]]
    report = cluster(
        base,
        representation=params,
        store=store,
        out=tmp_path,
        reduce="pca",
        scoring=Scoring(scaling="mutual-proximity"),
    )
    assert report.scaling == "mutual-proximity" and report.as_json()["scaling"] == "mutual-proximity"
    assert report.knn_score == knn_dataset_score(X, labels, scaling="mutual-proximity").score
    me = int(np.flatnonzero(meta["model"].to_numpy() == str(models[0].resolve()))[0])
    D = distance_matrix(X, scaling="mutual-proximity")
    order = [j for j in np.argsort(D[me], kind="stable") if j != me][:5]
    found = neighbors(models[0], representation=params, store=store, scoring=Scoring(scaling="mutual-proximity", k=5))
    assert list(found.nearest["model"]) == list(meta["model"].iloc[order])
    np.testing.assert_allclose(found.nearest["distance"], D[me, order], rtol=1e-6)
    plain = neighbors(models[0], representation=params, store=store, scoring=Scoring(k=5))
    assert not np.allclose(found.nearest["distance"], plain.nearest["distance"])  # -log MP, not the cosine distance
    result = CliRunner().invoke(
        app, ["neighbors", str(models[0]), "--k", "3", "--rank", "4", "--store", str(store), "--scaling", "nope"]
    )
    said = " ".join(result.output.replace("│", " ").split())
    assert (
        result.exit_code == 2 and "'nope' is not one of 'auto', 'none', 'mutual-proximity'" in said
    )  # refused as parsed


def _rows(store: Path) -> int:
    with modelvec.Store(store) as db:
        return len(db.reads.metadata())


def test_neighbors_of_a_model_not_in_the_store_embeds_it_on_the_fly(planted, tmp_path):
    """A new squad fine-tune: embedded with the stored representation against the stored base,
    compared, not stored; its vector is the one ``embed`` would have stored (distance 0 to it)."""
    base, models, _, store = planted
    newcomer = planted_dataset_finetune(base, tmp_path / "newcomer", 2, 777)
    before = _rows(store)
    found = neighbors(newcomer, representation=Representation(rank=4), store=store, scoring=Scoring(k=4))
    assert found.on_the_fly and found.warning is None and _rows(store) == before
    assert found.base == str(Path(base).resolve())
    assert [list(d) for d in found.nearest["datasets"]] == [["squad"]] * 4
    assert found.predicted == "squad" and found.vote_share == 1.0 and found.closeness > 0.0
    # the same model stored under another name: the on-the-fly vector equals the stored one
    copy = tmp_path / "copy" / "newcomer"
    copy.parent.mkdir()
    import shutil

    shutil.copytree(newcomer, copy)
    twin_store = tmp_path / "twin.duckdb"
    shutil.copy(store, twin_store)
    shutil.copy(f"{store}.vectors", f"{twin_store}.vectors")
    modelvec.embed(base, [copy], rank=4, store=twin_store)
    again = neighbors(newcomer, representation=Representation(rank=4), store=twin_store, scoring=Scoring(k=1))
    assert again.nearest["model"][0] == str(copy.resolve()) and again.nearest["distance"][0] < 1e-6
    result = CliRunner().invoke(app, ["neighbors", str(newcomer), "--k", "4", "--rank", "4", "--store", str(store)])
    text = " ".join(result.output.split())
    assert result.exit_code == 0 and "is not in the store: embedded now" in text and "predicted dataset: squad" in text


def test_neighbors_of_an_unreadable_or_unknown_model_is_one_clear_line(planted, tmp_path):
    _, _, _, store = planted
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(modelvec.ModelvecError, match=r"empty: no weights found"):
        neighbors(empty, representation=Representation(rank=4), store=store)
    result = CliRunner().invoke(app, ["neighbors", str(empty), "--rank", "4", "--store", str(store)])
    assert result.exit_code == 2 and "no weights found" in result.output
    with pytest.raises(modelvec.NothingStoredError, match="no vectors stored for this base"):
        neighbors(empty, representation=Representation(rank=4), store=store, base=str(tmp_path))


def test_neighbors_of_the_base_says_it_is_the_base_in_one_line(planted, tmp_path):
    """The vectors are deltas from the base: the base's own is zero, at distance 1 from every model. Asked about, by
    its path or with --base, it is said to be the base, never listed as a table of 1.0s with a prediction; a copy
    of the base that is not stored is refused alike once embedded."""
    base, _, _, store = planted
    rank4 = Representation(rank=4)
    for asked in ({}, {"base": str(base)}):
        with pytest.raises(
            modelvec.NothingStoredError, match="it is the base of the stored models: its vector is zero"
        ):
            neighbors(base, representation=rank4, store=store, **asked)
    for args in ([str(base)], [str(base), "--base", str(base)], ["--json", str(base)]):
        result = CliRunner().invoke(app, ["neighbors", *args, "--rank", "4", "--store", str(store)])
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1, result.output
        assert lines[0] == f"error: {base.resolve()}: {IS_THE_BASE}"
        assert "1.0000" not in result.output and "predicted" not in result.output
    copy = tmp_path / "copy-of-the-base"
    shutil.copytree(base, copy)
    with pytest.raises(modelvec.NothingStoredError, match=r"copy-of-the-base: its weights are the base's"):
        neighbors(copy, representation=rank4, store=store)


def test_neighbors_without_matching_vectors_says_what_the_store_holds(planted, tmp_path):
    _, models, _, store = planted
    stored = r"\(stored, with the options that read them: \S+ \[r4-sketch-mean\S+: --rank 4\]"
    with pytest.raises(modelvec.NothingStoredError, match=r"no vectors stored with representation r7-\S+ " + stored):
        neighbors(models[0], representation=Representation(rank=7), store=store)
    missing = tmp_path / "new.duckdb"  # a mistyped store is refused, never created
    empty = CliRunner().invoke(app, ["neighbors", str(models[0]), "--store", str(missing)])
    assert empty.exit_code == 2 and not missing.exists()
    assert f"{missing}: no store here: embed models into it first" in empty.output


def test_evaluate_scores_every_variant_on_the_same_models(planted, tmp_path):
    base, models, _, store = planted
    variants = {"U": Representation(rank=4, factor="U"), "sketch": Representation(rank=4, factor="sketch")}
    table = evaluate(base, models, variants=variants, store=store)
    assert list(table["method"]) == ["U", "sketch", REFERENCE, REFERENCE_BN]
    ref = table.set_index("method").loc[REFERENCE]
    assert ref["ref_corr"] == pytest.approx(1.0) and ref["knn_score"] == 1.0
    assert table.set_index("method").loc[REFERENCE_BN]["knn_score"] == 1.0
    assert (table["knn_spread"] == 0).all()  # one seed
    assert (table["n_scored"] == 12).all() and (table["knn_score"] == 1.0).all()
    sketch = table.set_index("method").loc["sketch"]
    assert sketch["dim"] == modelvec.DeltaEmbedder(rank=4, factor="sketch").fit(base).dim_
    assert sketch["ref_corr"] > 0.9  # a linear sketch keeps the geometry of the full deltas


def test_evaluate_scores_each_variant_over_seeds_with_their_spread(planted, tmp_path):
    """Every seed embedded (a key of its own), the scores their mean, knn_spread their range."""
    base, models, _, store = planted
    variants = {"cs": Representation(rank=4, projection="countsketch", rows=0.5)}
    table = evaluate(base, models, variants=variants, store=store, seeds=(0, 1, 2))
    row = table.set_index("method").loc["cs"]
    with modelvec.Store(store) as db:
        keys = set(db.reads.metadata()["params"])
    assert {Representation(rank=4, projection="countsketch", rows=0.5, seed=s).key() for s in (0, 1, 2)} <= keys
    assert row["params"] == Representation(rank=4, projection="countsketch", rows=0.5).key()
    singles = [
        evaluate(
            base,
            models,
            variants={"cs": Representation(rank=4, projection="countsketch", rows=0.5, seed=s)},
            store=store,
        )
        .set_index("method")
        .loc["cs", "knn_score"]
        for s in (0, 1, 2)
    ]
    assert row["knn_score"] == pytest.approx(np.mean(singles)) and row["knn_spread"] == pytest.approx(np.ptp(singles))


def test_the_grid_of_rows_and_projections(planted, tmp_path):
    from modelvec.studies.grid import variants
    from modelvec.studies.sweep import Sweep

    grid = variants(Sweep(rows=(1, 0.1), projection=("shared", "countsketch")), svd=False)
    assert all(p.factor == "sketch" for p in grid.values())
    # per projection and share, mean and concat (block-normed), and the shared whole-matrix sketch without it,
    # the deltas alone; and the default, marked
    assert len(grid) == 2 * 2 * 2 + 2 + 1
    assert [name for name, p in grid.items() if p == Representation()] == [f"{Representation().label()} (default)"]
    assert all(p.head == "none" for p in grid.values() if p != Representation())
    same = variants(Sweep(rows="auto", projection="countsketch"), svd=False, default=False)
    assert Representation(head="none") in same.values() and Representation() not in same.values()
    assert len({p.key() for p in grid.values()}) == len(grid)


def test_evaluate_variants_are_named_by_distinct_parameters(planted, tmp_path):
    from modelvec.studies.grid import VARIANTS, variants
    from modelvec.studies.sweep import Sweep

    for table in (VARIANTS, variants(Sweep(rank=(8, 16, 32)))):
        keys = [p.key() for p in table.values()]
        assert len(set(keys)) == len(keys) == len(table)  # distinct labels mean distinct computations
        assert all(name.removesuffix(" (default)") == p.label() for name, p in table.items())
    assert len(variants(Sweep(rank=(8, 16, 32)))) - 1 == 3 * (len(VARIANTS) - 1)  # the default once
    base, models, _, store = planted
    twice = {"sketch": Representation(rank=4), "U": Representation(rank=4, factor="sketch")}
    with pytest.raises(ValueError, match="'sketch' and 'U' have the same parameters"):
        evaluate(base, models, variants=twice, store=store)


def test_explain_shares_sum_to_the_cosine_and_find_the_shared_block(tiny_bert, tmp_path):
    """Two fine-tunes that share one planted delta in one matrix (layer 1's v) and differ elsewhere: the
    block shares sum to each neighbour's cosine, and that block carries their similarity."""
    from safetensors.torch import load_file, save_file

    from modelvec.analyse.scores import cosine_contributions

    state = load_file(str(tiny_bert / "model.safetensors"))
    gen = torch.Generator().manual_seed(7)
    key = "encoder.layer.1.attention.self.value.weight"
    shared = torch.randn(state[key].shape, generator=gen) * 0.05
    paths = []
    for i in range(3):
        tuned = {k: v + torch.randn(v.shape, generator=gen) * 0.002 for k, v in state.items()}
        if i < 2:
            tuned[key] = state[key] + shared + torch.randn(state[key].shape, generator=gen) * 0.002
        folder = tmp_path / f"ft{i}"
        folder.mkdir()
        save_file({k: v.contiguous() for k, v in tuned.items()}, str(folder / "model.safetensors"))
        (folder / "config.json").write_text((tiny_bert / "config.json").read_text())
        paths.append(folder)
    store = tmp_path / "s.duckdb"
    params = Representation(rank=4, pooling="concat")
    modelvec.embed(tiny_bert, paths, representation=params, store=store)
    found = neighbors(paths[0], representation=params, store=store, explain=True, scoring=Scoring(k=2))
    X, meta = Store(store).reads.load(representation=params)
    by_model = dict(zip(meta["model"], X))
    for item, distance in zip(found.explanation, found.nearest["distance"]):
        assert sum(b["share"] for b in item["blocks"]) == pytest.approx(1 - distance, abs=1e-6)
        assert sum(item["by_family"].values()) == pytest.approx(item["cosine"], abs=1e-9)
    nearest = found.explanation[0]
    assert nearest["model"] == str(paths[1])
    top = nearest["blocks"][0]
    assert (top["layer"], top["family"]) == (1, "v") and top["share"] > 0.5 * nearest["cosine"]
    q = by_model[str(paths[0])]
    shares = cosine_contributions(q, np.stack([by_model[str(p)] for p in paths[1:]]), [(0, len(q))])
    assert shares[:, 0] == pytest.approx([1 - d for d in found.nearest["distance"]], abs=1e-6)
    args = ["neighbors", str(paths[0]), "--k", "2", "--rank", "4", "--pooling", "concat", "--store", str(store)]
    result = CliRunner().invoke(app, [*args, "--explain", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["explanation"] == json.loads(json.dumps(found.as_json()))["explanation"]
    text = CliRunner().invoke(app, [*args, "--explain"])
    assert text.exit_code == 0 and "top blocks v L2" in text.output
    modelvec.embed(tiny_bert, paths, representation=Representation(rank=4), store=store)  # layers averaged
    averaged = CliRunner().invoke(app, [*args[:-4], "--store", str(store), "--explain"])
    assert averaged.exit_code == 0, averaged.output
    assert "= families v +" in averaged.output and "top blocks" not in averaged.output  # the blocks are the families


def test_per_block_knn_score_finds_the_planted_block_and_draws_the_heat_map(tiny_bert, tmp_path):
    """Two datasets whose fine-tunes differ only in layer 1's k (a dataset-specific delta there; noise
    everywhere else): that block alone separates them best."""
    from safetensors.torch import save_file

    state = load_file(str(tiny_bert / "model.safetensors"))
    gen = torch.Generator().manual_seed(3)
    key = "encoder.layer.1.attention.self.key.weight"
    planted = {d: torch.randn(state[key].shape, generator=gen) * 0.05 for d in ("a", "b")}
    paths = []
    for i in range(8):
        dataset = "ab"[i % 2]
        tuned = {k: v + torch.randn(v.shape, generator=gen) * 0.01 for k, v in state.items()}
        tuned[key] = tuned[key] + planted[dataset]
        folder = tmp_path / f"ft{i}"
        folder.mkdir()
        save_file({k: v.contiguous() for k, v in tuned.items()}, str(folder / "model.safetensors"))
        (folder / "config.json").write_text((tiny_bert / "config.json").read_text())
        (folder / "README.md").write_text(f"---\ndatasets: [{dataset}]\n---\n")
        paths.append(folder)
    store = tmp_path / "s.duckdb"
    params = Representation(rank=4, pooling="concat")
    modelvec.embed(tiny_bert, paths, representation=params, store=store)
    report = cluster(tiny_bert, representation=params, store=store, out=tmp_path / "out", reduce="pca")
    blocks = {(b["layer"], b["family"]): b["knn_score"] for b in report.per_block}
    assert len(blocks) == 2 * 6  # 2 layers x 6 families of the tiny BERT
    assert blocks[(1, "k")] == 1.0 and max(v for b, v in blocks.items() if b != (1, "k")) < 1.0
    png = Path(report.files["blocks"])
    assert png.read_bytes()[:4] == b"\x89PNG" and png.parent == tmp_path / "out"
    modelvec.embed(tiny_bert, paths, representation=Representation(rank=4), store=store)
    mean = cluster(tiny_bert, representation=Representation(rank=4), store=store, out=tmp_path / "m", reduce="pca")
    assert [b["layer"] for b in mean.per_block] == [None] * 6  # layers pooled: one row of families


def test_the_map_is_chosen_by_size_and_says_so(planted, tmp_path):
    """reduce='auto' draws t-SNE for a hundred models or fewer and UMAP from
    there; the report names what it drew and why."""
    from modelvec.analyse.reduction import AUTO_UMAP_FROM, Reduction

    base, _, _, store = planted
    report = cluster(base, representation=Representation(rank=4), store=store, out=tmp_path)
    assert report.reduce == "tsne" and "t-SNE for 13 models" in report.reduce_note
    assert (tmp_path / "clusters-tsne.png").exists() and not (tmp_path / "clusters-umap.png").exists()
    auto = Reduction()
    assert auto.reducer_for(AUTO_UMAP_FROM)[0] == "umap" and auto.reducer_for(AUTO_UMAP_FROM - 1)[0] == "tsne"
    chosen = cluster(base, representation=Representation(rank=4), store=store, out=tmp_path, reduce="pca")
    assert chosen.reduce == "pca" and chosen.reduce_note is None


def test_a_map_laid_out_without_numbas_kept_code_says_so_in_every_report_that_lays_one_out(
    planted, tmp_path, monkeypatch
):
    """The layout's kept code not trusted (here: it lays out elsewhere than its source) is a state of the machine, not
    an event: each report that lays out a map says it, one that lays none out does not."""
    from modelvec.analyse import descent, umap_style

    base, models, _, _ = planted
    store, kept, rep = tmp_path / "s.duckdb", descent.descend, Representation(rank=4)

    def damaged(Y, *args):
        kept(Y, *args)
        Y += 1e-3

    modelvec.embed(base, models, rank=4, store=store)
    monkeypatch.setattr(descent, "descend", damaged)
    umap_style._kernel.cache_clear()
    try:
        laid = [
            cluster(base, representation=rep, store=store, out=tmp_path / f"m{i}", reduce="umap", seed=i)
            for i in (0, 1)
        ]
        pca = cluster(base, representation=rep, store=store, out=tmp_path / "pca", reduce="pca")
    finally:
        umap_style._kernel.cache_clear()
    for report in laid:
        (line,) = [r for r in report.repaired if "kept code of the map's layout" in r]
        assert "gives other layouts than its source: compiled anew" in line
    assert not [r for r in pca.repaired if "kept code" in r]
    assert umap_style.kept_code_note() is None  # the kernel not made again since: nothing to say


def lora_adapter(base: Path, out: Path, seed: int) -> Path:
    """A PEFT LoRA adapter of ``base`` (query and value, r 2), its factors random."""
    from peft import LoraConfig, get_peft_model
    from transformers import BertModel

    torch.manual_seed(seed)
    model = get_peft_model(
        BertModel.from_pretrained(base), LoraConfig(r=2, target_modules=["query", "value"], init_lora_weights=False)
    )
    model.save_pretrained(out)
    return out


def test_auto_scaling_ranks_by_mutual_proximity_where_adapters_and_full_finetunes_mix(planted, tmp_path):
    """The default scaling: distances as they are for full fine-tunes alone; mutual proximity, said in one line, once
    the store holds adapters beside them (the kind is recorded as each model is embedded)."""
    from modelvec.analyse.scores import knn_dataset_score

    base, models, _, _ = planted
    store, params = tmp_path / "mixed.duckdb", Representation(rank=4)
    modelvec.embed(base, models[:4], representation=params, store=store)
    full_only = cluster(base, representation=params, store=store, out=tmp_path / "f", reduce="pca")
    assert (full_only.scaling, full_only.scaling_note) == ("none", None)
    adapters = [lora_adapter(base, tmp_path / f"lora{i}", seed=i) for i in range(2)]
    assert not modelvec.embed(base, adapters, representation=params, store=store).failed
    with Store(store, read_only=True) as db:
        X, meta = db.reads.load(representation=params)
    kinds = dict(zip(meta["model"], meta["adapter"]))
    assert [kinds[modelvec.core.model_id(a)] for a in adapters] == [True, True]
    assert [kinds[modelvec.core.model_id(m)] for m in models[:4]] == [False] * 4
    mixed = cluster(base, representation=params, store=store, out=tmp_path / "m", reduce="pca")
    assert mixed.scaling == "mutual-proximity"
    assert "2 LoRA adapters and 4 full fine-tunes" in mixed.scaling_note
    labels = [list(d) for d in meta["datasets"]]
    assert mixed.knn_score == knn_dataset_score(X, labels, scaling="mutual-proximity").score
    plain = cluster(
        base, representation=params, store=store, out=tmp_path / "p", reduce="pca", scoring=Scoring(scaling="none")
    )
    assert (plain.scaling, plain.scaling_note) == ("none", None)
    found = neighbors(models[0], representation=params, store=store)
    assert found.scaling == "mutual-proximity" and found.scaling_note == mixed.scaling_note
    result = CliRunner().invoke(
        app, ["cluster", str(base), "--rank", "4", "--store", str(store), "--out", str(tmp_path)]
    )
    assert result.exit_code == 0 and "neighbours by mutual proximity: 2 LoRA adapters" in " ".join(
        result.output.split()
    )


def _made_store(path: Path, n: int = 36, dim: int = 300) -> tuple[Path, np.ndarray]:
    """``n`` made vectors in 4 datasets (directions plus noise), a third marked LoRA adapters."""
    from modelvec.store import VectorRow

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((4, dim)).astype(np.float32)
    X = np.stack([centres[i % 4] + 0.5 * rng.standard_normal(dim).astype(np.float32) for i in range(n)])
    params = Representation()
    with Store(path) as db:
        db.writes.put_many(
            [
                VectorRow(
                    f"m{i:02d}",
                    f"h{i}",
                    "base",
                    "bh",
                    params,
                    "bert",
                    X[i],
                    [f"ds{i % 4}"],
                    "made",
                    0.1,
                    adapter=i % 3 == 2,
                )
                for i in range(n)
            ]
        )
    return path, X


def _damage(store: Path, model: str) -> None:
    with Store(store) as db:
        offset = db.con.execute('SELECT "offset" FROM vectors WHERE model = ?', [model]).fetchall()[0][0]
    with open(f"{store}.vectors", "r+b") as f:
        f.seek(offset + 40)
        f.write(b"\xff\xff\xff\xff")


def test_a_damaged_vector_is_one_line_and_the_others_are_clustered_and_searched(tmp_path):
    """``cluster`` and ``neighbors`` on a store with one damaged vector: one line naming it (status 1), every other
    model scored and searched, the same scores as a store without it."""
    import subprocess
    import sys

    store, _ = _made_store(tmp_path / "s.duckdb")
    clean = cluster("base", store=store, out=tmp_path / "clean", reduce="pca")
    _damage(store, "m05")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", "from modelvec.cli import main; main()", *args, "--store", str(store)],
            capture_output=True,
            text=True,
            timeout=300,
        )

    done = run("cluster", "base", "--out", str(tmp_path / "out"), "--reduce", "pca", "--json")
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("left out: m05: its stored vector") and "checksum" in lines[0]
    report = json.loads(done.stdout)
    assert report["n_models"] == 35 and list(report["damaged"]) == ["m05"]
    assert report["knn_score"] == pytest.approx(clean.knn_score, abs=0.05) and "Traceback" not in done.stderr
    near = run("neighbors", "m00", "--json")
    assert near.returncode == 1 and "left out: m05" in near.stderr
    assert "m05" not in [row["model"] for row in json.loads(near.stdout)["nearest"]]
    mine = run("neighbors", "m05")
    assert mine.returncode == 2 and mine.stderr.strip().startswith("error: m05: its stored vector")
    assert len(mine.stderr.strip().splitlines()) == 1


def test_cluster_keeps_the_products_and_a_second_run_reads_them(tmp_path):
    """The first run computes every pairwise product and keeps them beside the store; the second reads them (no
    vector read) and reports the same scores; a model added since costs its own row only."""
    from modelvec.store import VectorRow

    store, X = _made_store(tmp_path / "s.duckdb")
    first = cluster("base", store=store, out=tmp_path / "a", reduce="pca")
    assert Path(f"{store}.products").is_dir()
    rows: list[tuple[int, int]] = []
    again = cluster("base", store=store, out=tmp_path / "b", reduce="pca", progress=lambda d, t: rows.append((d, t)))
    assert rows == [] and again.knn_score == first.knn_score and again.per_dataset == first.per_dataset
    with Store(store) as db:
        db.writes.put(VectorRow("new", "hn", "base", "bh", Representation(), "bert", X[0] * 1.01, ["ds0"], "made", 0.1))
    third = cluster("base", store=store, out=tmp_path / "c", reduce="pca", progress=lambda d, t: rows.append((d, t)))
    assert rows == [(1, 1)] and third.n_models == 37


def test_a_store_too_large_for_the_memory_left_is_one_line_saying_what_fits(tmp_path, monkeypatch):
    """Before any product is computed: the memory the products need against what the kernel says is free, in one
    line naming how many models would fit, never a swap storm."""
    from modelvec.core.errors import ResourceError
    from modelvec.store.views import population as stored

    store, _ = _made_store(tmp_path / "s.duckdb")
    monkeypatch.setattr(stored.machine, "available_memory", lambda: 100_000)
    with pytest.raises(
        ResourceError, match=r"^36 models: their pairwise products need about .* GiB are free: about \d+ models fit"
    ):
        cluster("base", store=store, out=tmp_path / "out", reduce="pca")
    assert not Path(f"{store}.products").exists()  # nothing was computed
    monkeypatch.setattr(stored.machine, "available_memory", lambda: None)  # a kernel that does not say: no check
    assert cluster("base", store=store, out=tmp_path / "out", reduce="pca").n_models == 36


def test_float32_products_leave_the_report_and_the_neighbour_orders_as_float64_has_them(tmp_path, monkeypatch):
    """``cluster`` over products computed in float32 (as above a few seconds of work) gives the report of float64
    products: the kNN scores, the predictions, the clusterers, and every model's neighbours in the same order."""
    from modelvec.analyse.scores import Geometry
    from modelvec.store.derived import products as module

    reports, orders = [], []
    for exact_up_to in (module.EXACT_UP_TO, 0):
        monkeypatch.setattr(module, "EXACT_UP_TO", exact_up_to)
        store, _ = _made_store(tmp_path / f"s{exact_up_to}.duckdb")
        report = cluster("base", store=store, out=tmp_path / f"o{exact_up_to}", reduce="pca", device="cpu")
        reports.append({k: v for k, v in report.as_json().items() if k != "files"})
        with Store(store, read_only=True) as db:
            G = module.gram(db.vector_file, db.reads.select()[0]).gram
        orders.append(Geometry.from_products(G).neighbours(36)[0])
    assert reports[0]["knn_score"] == reports[1]["knn_score"] and reports[0]["per_dataset"] == reports[1]["per_dataset"]
    assert _alike(reports[0], reports[1])  # what is counted exactly equal; continuous scores within float32 rounding
    np.testing.assert_array_equal(orders[0], orders[1])


def _alike(a: object, b: object) -> bool:
    """Equal, numbers within 1e-6 of each other (NaN equal to NaN), through dicts and lists."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_alike(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_alike(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-6, abs=1e-9, nan_ok=True)
    return a == b
