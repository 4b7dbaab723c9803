"""A run's ledger: the models asked for, which need computing, and what the run wrote and said of each.

The pipeline (:mod:`modelvec.run.pipeline`) hands it the models; it skips what the store holds (an alias, a stored
vector, a card read again, a known failure), yields the tasks left to compute, and records each outcome through the
store's writer: a vector written, or a failure with its kind. What it kept and said is the run's :class:`EmbedResult`;
each model's end is a :class:`Step` for a display.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..core.errors import Kind, ModelvecError, error_of
from ..core.names import model_id
from ..hub.client import HUB_REFUSED, HubSettings
from ..hub.discovery import CatalogueEntry
from ..hub.download import weights_identity
from ..represent.representation import Representation
from ..store import Failure, Store, VectorRow
from ..store.formats.records import Alias, CardUpdate
from ..store.formats.vectorfile import checksum, vector_bytes
from .tasks import Model, task_of
from .work import BaseSpec, Outcome, Task


@dataclass
class EmbedResult:
    """What ``embed`` did: the vectors of the requested models that are stored, and what failed."""

    vectors: np.ndarray
    metadata: pd.DataFrame
    embedded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    store: str | None = None  # the store file written
    #: how some models were read, said once per run: note -> the models it concerns (e.g. downloaded whole)
    notes: dict[str, list[str]] = field(default_factory=dict)
    #: the failed models whose failure was recorded by an earlier run and not tried again (``force`` retries)
    recorded: list[str] = field(default_factory=list)
    #: what the run kept of the vectors' products for the map, one line (None: nothing; ``products_from``)
    kept_products: str | None = None
    #: the models given under a second name (the same weight files as a stored model): alias -> the stored model
    aliases: dict[str, str] = field(default_factory=dict)
    #: the models whose weights are another stored model's bit for bit (a mirror): model -> that model; stored, and
    #: counted once in every report, as the original (``tree`` says which and why)
    same_weights: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """What was embedded, skipped and failed (model -> reason), and where; the vectors are in the store."""
        return {
            "store": self.store,
            "embedded": list(self.embedded),
            "skipped": list(self.skipped),
            "failed": dict(self.failed),
            "notes": {note: list(models) for note, models in self.notes.items()},
            "recorded": list(self.recorded),
            "kept_products": self.kept_products,
            "aliases": dict(self.aliases),
            "same_weights": dict(self.same_weights),
        }


@dataclass(frozen=True)
class Step:
    """A run's progress, as a display needs it (``embed(..., on_step=...)``): how many models there are, then each
    model's end with the bytes it cost.

    ``status`` is ``"begin"`` once, when the run's models are known (``total``: their number, None for a stream of
    unknown length), before anything is fetched; then one of ``"embedded"``, ``"skipped"`` (already stored) and
    ``"failed"`` per model, with ``detail`` (the failure's one line) and its ``kind`` for a failure; and
    ``"keeping"`` once at the end where the run then keeps the vectors' products for the map (``products_from``). ``fetched`` is
    what this run added to the Hub cache for the model: the bytes it holds of the model's files (0 for a local
    model or one already cached; bytes of retried answers are not counted, see the Hub's own count for those).
    """

    status: str
    model: str = ""
    detail: str = ""
    total: int | None = None
    fetched: int = 0
    kind: str | None = None


OnStep = Callable[[Step], None]

#: What a run says of the models it embedded again because the base changed since they were stored (once a run).
BASE_CHANGED = (
    "the base has changed since these were embedded against it: embedded again against the base as it is now "
    "(the reports use these; `modelvec compact` drops the vectors of the earlier version)"
)
#: What a run says of stored models whose card changed since (once a run).
CARD_CHANGED = "their cards changed since they were stored: their labels read again, their vectors kept"
#: What a run says of a quantization (a GGUF file): its trace is taken, it is no point on the map.
QUANTIZED = "a quantization ({}): its trace places it in the model tree; it is left off the map and out of every score"
#: What a run says of a model whose weights are the base's (a re-upload of it, an untrained adapter).
COPY_OF_BASE = (
    "its weights are the base's in every matrix read (a copy of the base): stored as such, left off the map and "
    "out of every score"
)


class Ledger:
    """One run's state: the models asked for, what it wrote and said of each (``result``), and the store's writer
    that commits outcomes as they arrive."""

    def __init__(
        self,
        spec: BaseSpec,
        representation: Representation,
        db: Store,
        force: bool,
        report: OnStep,
        hub_settings: HubSettings,
    ) -> None:
        self.spec, self.representation, self.db, self.force = spec, representation, db, force
        self.report, self.hub_settings = report, hub_settings
        self.result = EmbedResult(vectors=np.zeros((0, 0), np.float32), metadata=pd.DataFrame(), store=str(db.path))
        self.wanted: list[str] = []  # every model asked for, in order (the vectors loaded at the end)
        self.writer = db.writes.writer()
        self.hub_down: str | None = None  # the line said once the Hub refused connections: nothing more is tried
        self.files: dict[str, str] = {}  # the local weight files of this run's models (files_id -> its first name)
        self.vectors: dict[str, str] = {}  # the checksums of this run's vectors (-> the first model of each)

    def fail(self, name: str, error: str, model_version: str | None, kind: Kind, fetched: int = 0) -> None:
        """A model failed now: recorded in the store (with its kind) and in the result."""
        self.writer.put(
            Failure(
                model=name,
                base=self.spec.name,
                representation=self.representation,
                error=error,
                model_version=model_version,
                kind=kind,
            )
        )
        self.result.failed[name] = error
        self.report(Step(status="failed", model=name, detail=error, fetched=fetched, kind=Kind(kind).value))
        if HUB_REFUSED in error and self.hub_down is None:
            self.hub_down = error.split(": ", 1)[-1] if error.startswith(f"{name}: ") else error

    def not_tried(self, name: str) -> None:
        """A model left when the Hub refused connections: recorded as a transient failure (tried next run), said
        once in the run's notes."""
        line = f"{self.hub_down}: the models left were not tried, recorded as transient failures (tried next run)"
        self.result.notes.setdefault(line, []).append(name)
        self.fail(name, f"{name}: not tried: {self.hub_down}", None, Kind.TRANSIENT)

    def todo(self, models: Iterable[Model]) -> Iterator[Task]:
        """The models that need computing; the rest are skipped or known failures (checked lazily)."""
        spec, representation, db = self.spec, self.representation, self.db
        for model in models:
            name = model.model if isinstance(model, CatalogueEntry) else model_id(model)
            self.wanted.append(name)
            if self.hub_down is not None:
                self.not_tried(name)
                continue
            if self._stored(model, name):  # known by its catalogued commit: nothing is asked of the Hub for it
                continue
            try:
                task = task_of(model, spec, db, self.hub_settings)
            except Exception as exc:
                err = error_of(exc, name)
                if err.model == spec.name:
                    raise err from exc
                self.fail(name, str(err), None, err.kind)
                continue
            if self._settled(task):
                continue
            known = None if self.force else db.reads.known_failure(name, task.version, spec.name, representation)
            if known is not None:  # the same weights failed before: not fetched or read again (--force retries)
                self.result.failed[name] = known
                self.result.recorded.append(name)
                self.report(Step(status="failed", model=name, detail=known, kind=Kind.CONTENT.value))
                continue
            if any(h != spec.version for h in db.versions.model_versions(name, spec.name, representation)):
                self.result.notes.setdefault(BASE_CHANGED, []).append(name)
            yield task

    def _same_vector(self, name: str, vector: np.ndarray) -> str | None:
        """Another model, stored or embedded in this run, whose vector is this one bit for bit: the same weights."""
        digest = checksum(vector_bytes(vector))
        first = self.vectors.setdefault(digest, name)
        if first != name:
            return first
        spec = self.spec
        return self.db.reads.same_vector(digest, name, spec.name, spec.version, self.representation)

    def _settled(self, task: Task) -> bool:
        """Whether nothing is to be computed for ``task``: the same weight files as a model stored or embedded in this
        run under another name (an alias: one model, stored once), or already stored (its card read again where it
        changed, or, for a new Hub commit that left its weights as they were, its version and labels updated)."""
        spec, db, name = self.spec, self.db, task.name
        if task.files_id is not None:
            first = self.files.setdefault(task.files_id, name)
            other = (
                first
                if first != name
                else db.reads.same_files(task.files_id, name, spec.name, spec.version, self.representation)
            )
            if other is not None:
                self.writer.put(Alias(base=spec.name, alias=name, model=other))
                self.result.aliases[name] = other
                self.report(Step(status="skipped", model=name, detail=f"an alias of {other}"))
                return True
        if self.force:
            return False
        if db.reads.has(name, task.version, spec.name, spec.version, self.representation):
            self._read_card_again(task)
        elif not self._same_weights(task):
            return False
        self.result.skipped.append(name)
        self.report(Step(status="skipped", model=name, detail="already stored"))
        return True

    def _read_card_again(self, task: Task, version: str | None = None, old: str | None = None) -> None:
        """A stored model's card read again (a local one's from its folder, a Hub one's as its entry has it): where
        it changed since it was stored, its labels and declarations are updated, its vector kept (said once)."""
        stored = self.db.reads.card_of(task.name, self.spec.name)
        card = task.card()
        if stored is None or (version is None and card.digest in (None, stored[0])):  # None: the catalogue's own
            return
        update = CardUpdate(
            model=task.name,
            base=self.spec.name,
            card_hash=card.digest,
            datasets=card.datasets,
            label_source=card.label_source,
            author=card.author,
            relation=card.relation,
            parents=card.parents,
            model_version=version,
            old_version=old,
        )
        self.writer.put(update)
        if sorted(stored[1]) != sorted(card.datasets):
            was, now = ", ".join(sorted(stored[1])) or "none", ", ".join(sorted(card.datasets)) or "none"
            self.result.notes.setdefault(CARD_CHANGED, []).append(f"{task.name}: {was} -> {now}")

    def _same_weights(self, task: Task) -> bool:
        """A Hub model stored at an earlier commit whose weights the new commit leaves as they were (a card edited,
        say; asked of the Hub's file listings): its stored version moves to the new commit, its card is read again,
        nothing is fetched. False where the weights changed, or the Hub cannot tell."""
        if task.repo is None or task.sha is None or self.hub_settings.offline:
            return False
        spec = self.spec
        old = self.db.reads.stored_version(task.name, spec.name, spec.version, self.representation)
        if old is None or not old.startswith("git:") or old == task.version:
            return False
        try:
            now = weights_identity(task.repo, task.sha, self.hub_settings)
            same = now is not None and weights_identity(task.repo, old.removeprefix("git:"), self.hub_settings) == now
        except ModelvecError:  # the Hub cannot say: embedded again, as before
            return False
        if same:
            self._read_card_again(task, task.version, old)
        return same

    def _stored(self, model: Model, name: str) -> bool:
        """A catalogued Hub model stored at its commit: skipped before its task is made (an adapter's task fetches
        its adapter_config.json, which a stored one need not cost)."""
        if self.force or not isinstance(model, CatalogueEntry) or not model.sha:
            return False
        spec = self.spec
        if not self.db.reads.has(name, f"git:{model.sha}", spec.name, spec.version, self.representation):
            return False
        self.result.skipped.append(name)
        self.report(Step(status="skipped", model=name, detail="already stored"))
        return True

    def record(self, outcome: Outcome) -> bool:
        """An engine's outcome: a failure recorded, or the vector written (True)."""
        task = outcome.task
        if outcome.error is not None:
            self.fail(task.name, outcome.error, task.version, outcome.kind, outcome.fetched)
            return False
        self.writer.put(_row(outcome, self.spec, self.representation))
        self.result.embedded.append(task.name)
        quantized = QUANTIZED.format(outcome.quantized) if outcome.quantized else None
        card = outcome.card.note(task.name) if outcome.card is not None else None
        zero = not np.any(outcome.vector)
        for note in (outcome.note, card, COPY_OF_BASE if zero else None, quantized):
            if note is not None:
                self.result.notes.setdefault(note, []).append(task.name)
        same = None if zero or outcome.vector is None else self._same_vector(task.name, outcome.vector)
        if same is not None:
            self.result.same_weights[task.name] = same
        detail = f"{outcome.seconds:.2f}s"
        self.report(Step(status="embedded", model=task.name, detail=detail, fetched=outcome.fetched))
        return True


def _row(outcome: Outcome, spec: BaseSpec, representation: Representation) -> VectorRow:
    """The store's row of a model's vector."""
    task = outcome.task
    return VectorRow(
        model=task.name,
        model_version=task.version,
        base=spec.name,
        base_version=spec.version,
        representation=representation,
        architecture=str(outcome.architecture),
        vector=outcome.vector,  # type: ignore[arg-type]  # no error: a vector
        datasets=outcome.datasets,
        source=task.source,
        seconds=outcome.seconds,
        label_source=outcome.label_source,
        author=outcome.author,
        adapter=outcome.adapter,
        quantized=outcome.quantized,
        trace=outcome.trace,
        parent=task.parent.name if task.parent is not None else None,
        card_hash=outcome.card.digest if outcome.card is not None else None,
        relation=outcome.card.relation if outcome.card is not None else None,
        parents=outcome.card.parents if outcome.card is not None else None,
        created=task.created,
        files_id=task.files_id,
    )
