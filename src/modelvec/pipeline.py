"""The embedding pipeline: many fine-tunes of one base, through the store, failures recorded.

The base is read once (lazily: a run where everything is stored never reads it). Each model's
vector is written to the store as soon as it is computed; a bad model is recorded as failed with
its one-line reason and the run goes on.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from .cards import card_author, card_datasets, read_card
from .checkpoint import Checkpoint
from .errors import ModelvecError
from .representation import DeltaEmbedder, Representation
from .store import Store, VectorRow

PathLike = str | os.PathLike[str]


def model_id(model: PathLike) -> str:
    """How the store names a local model: its absolute path (hub ids come with the Hub issue)."""
    return str(Path(model).resolve())


def display_name(model: PathLike | str) -> str:
    """A readable name for a model or base: a local folder named just "model" is named with its parent."""
    path = Path(model)
    return f"{path.parent.name}/{path.name}" if path.name in ("model", "base", "") and path.parent.name else path.name


@dataclass
class EmbedResult:
    """What ``embed`` did: the vectors of the requested models that are stored, and what failed."""

    vectors: np.ndarray
    metadata: pd.DataFrame
    embedded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


Progress = Callable[[str, str, str], None]  # (model, status, detail)


def embed(
    base: PathLike,
    models: Iterable[PathLike],
    *,
    representation: Representation | None = None,
    device: str = "cpu",
    store: Store | PathLike | None = None,
    force: bool = False,
    progress: Progress | None = None,
    **params: Any,
) -> EmbedResult:
    """Embed fine-tunes of ``base`` into the store and return their vectors and metadata.

    The representation is ``representation`` or built from keyword parameters
    (``rank=8, factor="U", pooling="mean", solver=..., sign=..., n_iter=..., n_oversamples=...,
    seed=...``; see :class:`Representation`). Models already stored with the same weights, base
    and representation are skipped unless ``force``. A model that fails is recorded
    (``result.failed``: model -> reason) and the run goes on. ``store=None`` uses
    ``$MODELVEC_STORE`` or ``./modelvec.duckdb``.
    """
    params = representation or Representation(**params)
    own_store = not isinstance(store, Store)
    db = Store(store) if own_store else store
    try:
        return _run(base, list(models), params, device, db, force, progress or (lambda *_: None))
    finally:
        if own_store:
            db.close()


def _run(base: PathLike, models: Sequence[PathLike], params: Representation, device: str, db: Store,
         force: bool, progress: Progress) -> EmbedResult:
    base_ck = Checkpoint(base, name=model_id(base))
    base_name, base_hash = base_ck.name, base_ck.fingerprint()
    embedder: DeltaEmbedder | None = None
    result = EmbedResult(np.zeros((0, 0), np.float32), pd.DataFrame())
    wanted: list[str] = []
    for model in models:
        name = model_id(model)
        wanted.append(name)
        start = time.perf_counter()
        try:
            ck = Checkpoint(model, name=name)
            model_hash = ck.fingerprint()
            if not force and db.has(name, model_hash, base_name, base_hash, params):
                result.skipped.append(name)
                progress(name, "skipped", "already stored")
                continue
            if embedder is None:
                embedder = DeltaEmbedder.from_params(params, device).fit(base_ck)
            vector = embedder.embed_one(ck)
            seconds = time.perf_counter() - start
            card = read_card(ck.folder)
            datasets = card_datasets(card)
            db.put(VectorRow(name, model_hash, base_name, base_hash, params, embedder.layout_.arch.name, vector,
                             datasets, str(Path(model)), seconds, label_source="card" if datasets else None,
                             author=card_author(card)))
            result.embedded.append(name)
            progress(name, "embedded", f"{seconds:.2f}s")
        except ModelvecError as exc:
            if exc.model == base_name:  # the base itself is broken: nothing can be embedded
                raise
            _fail(db, result, progress, name, base_name, params, str(exc))
        except Exception as exc:  # a run over many models goes on; the reason is kept
            _fail(db, result, progress, name, base_name, params, f"{name}: {type(exc).__name__}: {exc}".splitlines()[0])
    result.vectors, result.metadata = db.load(base_name, params, models=wanted)
    return result


def _fail(db: Store, result: EmbedResult, progress: Progress, name: str, base: str, params: Representation, error: str) -> None:
    db.record_failure(name, base, params, error)
    result.failed[name] = error
    progress(name, "failed", error)
