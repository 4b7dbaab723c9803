"""The per-model work every engine runs: a :class:`Task` in, an :class:`Outcome` out.

The driver (:mod:`modelvec.run.pipeline`) decides what needs computing and writes the store; an
engine (:mod:`modelvec.run.engines`) takes a stream of tasks (one model each, small and
picklable) and yields one outcome per task (a vector, or the one-line reason it failed and its
kind). Every engine runs the same :func:`compute`, so a vector does not depend on where it was
computed.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..core.errors import Kind, error_of
from ..hub.cards import card_author, card_datasets, read_card
from ..hub.client import HubSettings
from ..hub.download import fetch, release
from ..read import open_checkpoint
from ..represent.params import Representation

if TYPE_CHECKING:
    from ..read import Checkpoint
    from ..represent import DeltaEmbedder


@dataclass(frozen=True)
class BaseSpec:
    """How any worker opens the base: a local path, or a Hub repo pinned to a sha."""

    name: str
    identity: str
    path: str | None = None
    repo: str | None = None
    sha: str | None = None

    def open(self, settings: HubSettings) -> Checkpoint:
        from ..read import Checkpoint

        if self.path is not None:
            return Checkpoint(self.path, name=self.name)
        return Checkpoint(fetch(str(self.repo), str(self.sha), None, settings), name=self.name)


@dataclass(frozen=True)
class Task:
    """One model to embed: its store name and identity, where its files are, and known labels."""

    name: str
    identity: str
    source: str
    path: str | None = None
    repo: str | None = None  # a Hub model, fetched at ``sha``
    sha: str | None = None
    files: tuple[str, ...] = ()
    datasets: tuple[str, ...] | None = None  # None: read them from the model card
    label_source: str | None = None
    author: str | None = None

    def open(self, settings: HubSettings) -> Checkpoint:
        """The model's checkpoint, fetched first when it lives on the Hub."""
        if self.repo is not None:
            return open_checkpoint(fetch(self.repo, str(self.sha), list(self.files) or None, settings), name=self.name)
        return open_checkpoint(str(self.path), name=self.name)

    def labels(self, ck: Checkpoint) -> tuple[list[str], str | None, str | None]:
        if self.datasets is not None:
            return list(self.datasets), self.label_source, self.author
        card = read_card(ck.folder)
        datasets = card_datasets(card)
        return datasets, "card" if datasets else None, card_author(card)

    def release(self, settings: HubSettings) -> None:
        """Delete a Hub model's fetched files (a local model is left alone); a failure to delete only warns."""
        if self.repo is not None:
            try:
                release(self.repo, str(self.sha), settings)
            except OSError as exc:
                warnings.warn(f"{self.name}: could not delete its cached files: {exc}", stacklevel=2)


@dataclass
class Outcome:
    """What became of one task: a vector, or the reason it failed.

    ``kind`` is the failure's (:class:`~modelvec.core.errors.Kind`): a ``content`` failure is kept with
    the model's identity, so the same files are not fetched again; ``transient`` (network, access)
    and ``resource`` (memory, disk) failures are tried again next run.
    """

    task: Task
    vector: np.ndarray | None = None
    architecture: str | None = None
    datasets: list[str] = field(default_factory=list)
    label_source: str | None = None
    author: str | None = None
    seconds: float = 0.0
    error: str | None = None
    kind: Kind = Kind.CONTENT


def fit_base(base: BaseSpec, params: Representation, device: str, settings: HubSettings) -> DeltaEmbedder:
    """The embedder with the base's matrices read (once per engine worker)."""
    from ..represent import DeltaEmbedder

    return DeltaEmbedder.from_params(params, device).fit(base.open(settings))


def compute(task: Task, embedder: DeltaEmbedder, checkpoint: Callable[[], Checkpoint]) -> Outcome:
    """Embed one model. The model's own faults become the outcome's error and kind; a fault of the base raises."""
    start = time.perf_counter()
    try:
        ck = checkpoint()
        try:
            vector = embedder.embed_one(ck)
            datasets, label_source, author = task.labels(ck)
        finally:
            ck.close()
    except Exception as exc:  # a run over many models goes on; the reason is kept
        err = error_of(exc, task.name)
        if err.model == embedder.base_.name and err.kind is Kind.CONTENT:  # the base is broken: nothing can be embedded
            raise err from exc
        return Outcome(task, error=str(err), kind=err.kind, seconds=time.perf_counter() - start)
    return Outcome(
        task, vector, embedder.layout_.arch.name, datasets, label_source, author, time.perf_counter() - start
    )
