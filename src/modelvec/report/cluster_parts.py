"""What both ways of making the cluster report share: the report itself, the per-block scores, the map's tree, the
imports made beside the reading, the map's layout version and the figures."""

from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..analyse.scores import Scoring, block_knn_scores
from ..analyse.tree import Tree
from ..core.errors import ModelvecError, NothingStoredError
from ..core.names import display_name
from ..plots.blocks import plot_block_scores
from ..plots.maps import plot_html, plot_png
from ..represent import blocks_of
from ..represent.representation import Representation
from ..store import Population


@dataclass
class ClusterReport:
    """Scores and written files of one ``cluster`` run; ``as_json()`` is the CLI's ``--json``."""

    base: str
    params: str
    n_models: int
    metric: str
    pool: str
    knn_score: float
    n_scored: int
    per_dataset: dict[str, dict[str, float]]
    loo_accuracy: float
    clustering: dict[str, float]
    predictions: list[dict[str, Any]]
    files: dict[str, str] = field(default_factory=dict)
    # Author effect: the kNN score when a model's same-author neighbours do not count.
    knn_score_other_authors: float = float("nan")
    n_scored_other_authors: int = 0
    n_authors: int = 0
    largest_author_share: float = float("nan")  # share of the models uploaded by the most prolific author
    label_sources: list[str] | None = None  # the label sources kept (None: all)
    #: the kNN dataset score of each block alone (stack, layer, family, knn_score); None when the base's
    #: files were not at hand to lay the blocks out
    per_block: list[dict[str, Any]] | None = None
    scaling: str = "none"  # how neighbours were ranked (``auto`` resolved: mutual proximity where kinds mix)
    scaling_note: str | None = None  # why, when ``auto`` chose it
    reduce: str = ""  # the map's reduction as drawn (``auto`` resolved)
    reduce_note: str | None = None  # why, when ``auto`` chose it
    per_block_note: str | None = None  # why there is no per-block score, when there is none
    k: int = 5  # the voters of the predictions and of ``loo_accuracy``
    #: stored vectors left out because their bytes do not match their checksum: model -> one line
    damaged: dict[str, str] = field(default_factory=dict)
    #: the population's version of the base (``base_hash``), its vectors embedded against earlier versions
    #: (``stale``, left out) and its models whose weights are the base's (``copies``, left out)
    population: dict[str, Any] = field(default_factory=dict)
    #: what the population left out and why (stale vectors, copies of the base): one line each
    notes: list[str] = field(default_factory=list)
    #: kept files that did not verify and were computed again: one line each (said on stderr, not part of the answer)
    repaired: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("clustering", "repaired")}
        out.update(self.clustering)
        return out


#: The per-block scores are computed on at most this many models (a sample spread over the datasets): each block's
#: own products would cost as much as all of them again, and each block's mutual proximity grows as the square of
#: the sample (224 blocks of an 8B base at 1,000 models took 6.7 s of a 10,000-model `cluster`'s 21 s).
BLOCK_SAMPLE = 500


#: The per-block scores' code: kept scores are read only where they were computed by the same (raise it when the
#: scores change what they give for the same vectors and labels).
PER_BLOCK_VERSION = 1


def block_sample(pop: Population, kept: np.ndarray, meta: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The vectors the per-block scores are computed on (all, up to :data:`BLOCK_SAMPLE` models; above, a seeded
    sample taken in turn from each dataset) and their rows of ``meta``."""
    n = len(kept)
    if n <= BLOCK_SAMPLE:
        rows = np.arange(n)
    else:
        rng = np.random.default_rng(0)
        groups: dict[str, list[int]] = {}
        for i, d in enumerate(meta["datasets"]):
            groups.setdefault(min(d) if len(d) else "", []).append(i)
        queues = [list(rng.permutation(g)) for _, g in sorted(groups.items())]
        picked: list[int] = []
        while len(picked) < BLOCK_SAMPLE:
            for q in queues:
                if q and len(picked) < BLOCK_SAMPLE:
                    picked.append(int(q.pop()))
        rows = np.sort(np.array(picked))
    return pop.rows(kept[rows]), rows


def per_block(
    pop: Population,
    positions: np.ndarray,
    meta: pd.DataFrame,
    files: str | None,
    scoring: Scoring,
) -> tuple[list[dict[str, Any]] | None, str | None, int]:
    """The kNN score of each block alone (the blocks laid out from the base's files), or why there is none, and how
    many models it was computed on. Blocks that are zeros in every vector (the head's, where no model has one; a
    layer no model changed) are left out. CacheFile beside the store for exactly these vectors, labels and blocks
    (:meth:`~modelvec.store.Population.derived`): computed only where none is kept."""
    if files is None:
        return (
            None,
            "no per-block scores: the base's files are not on this machine (nor in the Hub cache, HF_HUB_CACHE)",
            0,
        )
    try:
        blocks = blocks_of(files, pop.representation)
    except ModelvecError as exc:
        return None, f"no per-block scores: the base's files could not be laid out ({exc})", 0
    if not blocks or blocks[-1].stop != pop.selection.dim:
        return None, "no per-block scores: the stored vectors do not match the base's layout", 0

    def computed() -> dict[str, np.ndarray]:
        X, rows = block_sample(pop, positions, meta)
        labels = [list(meta["datasets"].iloc[i]) for i in rows]
        live = [i for i, b in enumerate(blocks) if X[:, b.start : b.stop].any()]  # a block no model has scores nothing
        bounds = [(blocks[i].start, blocks[i].stop) for i in live]
        scores = block_knn_scores(X, labels, bounds, metric=scoring.metric, scaling=scoring.scaling)
        return {"blocks": np.array(live, np.int64), "scores": scores, "sampled": np.array([len(X)], np.int64)}

    inputs = json.dumps(
        [
            PER_BLOCK_VERSION,
            BLOCK_SAMPLE,
            [sorted(d) for d in meta["datasets"]],
            [[b.stack, b.layer, b.family, b.start, b.stop] for b in blocks],
        ]
    )
    name = f"blocks-{scoring.metric}-{scoring.scaling}"
    kept = pop.derived(positions, name, computed, inputs=hashlib.sha256(inputs.encode()).hexdigest())
    found = [
        {"stack": blocks[i].stack, "layer": blocks[i].layer, "family": blocks[i].family, "knn_score": float(v)}
        for i, v in zip(kept["blocks"].tolist(), kept["scores"])
    ]
    return found, None, int(kept["sampled"][0])


#: What the scores and the figures import when first used (about 1.3 s on 2 cores): imported on the thread beside
#: while the store is read and its vectors checked, which wait on the disk and run outside Python's lock.
AHEAD = (
    "scipy.linalg",
    "numba",
    "sklearn.cluster",
    "sklearn.metrics",
    "sklearn.utils.extmath",
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
    "plotly.graph_objects",
)


def import_ahead() -> None:
    """Import :data:`AHEAD`; one that fails is left to fail where it is used, with its own message."""
    for name in AHEAD:
        try:
            importlib.import_module(name)
        except Exception:  # said where it is imported again, by the step that needs it
            pass


def map_tree(pop: Population, meta: pd.DataFrame) -> Tree | None:
    """The model tree the HTML map shows (its kinds, each model's parents and children, what the cards declare), at
    any size: None for fewer than two models, or where the store holds no traces (a map without a tree, no error)."""
    if len(meta) < 2:
        return None
    from .tree import tree_of

    try:
        return tree_of(pop)
    except NothingStoredError:
        return None


#: The map's layout code: a kept layout is used only where it was made by the same (raise it when the reductions
#: change what they give for the same coordinates).
MAP_VERSION = 2


def layout_version() -> str:
    """What a kept map was laid out by: :data:`MAP_VERSION` and the versions of the libraries that lay maps out."""
    from importlib.metadata import version

    return f"v{MAP_VERSION}-numba{version('numba')}-sklearn{version('scikit-learn')}"


def draw_blocks(report: ClusterReport, folder: Path, representation: Representation, sampled: int, n: int) -> None:
    """The per-block heat map, where there are per-block scores."""
    if not report.per_block:
        return
    title = f"which layers and families separate the datasets ({representation.key()})"
    if sampled < n:
        title += f"; a sample of {sampled:,} of {n:,} models"
    report.files["blocks"] = str(
        plot_block_scores(pd.DataFrame(report.per_block), folder / "blocks-knn.png", title=title)
    )


def draw(
    report: ClusterReport,
    coords: np.ndarray | None,
    meta: pd.DataFrame,
    folder: Path,
    representation: Representation,
    tree: Tree | None,
) -> None:
    """The map (PNG and HTML) of the layout ``coords`` (None: fewer than three models, no map)."""
    reduce = report.reduce
    if coords is None:
        return
    title = f"{len(meta)} fine-tunes of {display_name(report.base)}"
    subtitle = f"{representation.key()} · {reduce.upper()} · kNN dataset score {report.knn_score:.2f} ({report.n_scored} scored)"
    report.files["png"] = str(
        plot_png(coords, meta, folder / f"clusters-{reduce}.png", reducer=reduce, title=title, subtitle=subtitle)
    )
    report.files["html"] = str(
        plot_html(
            coords, meta, folder / f"clusters-{reduce}.html", reducer=reduce, title=f"{title} — {subtitle}", tree=tree
        )
    )
