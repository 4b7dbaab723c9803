"""The per-model work every engine runs: a :class:`Task` in, an :class:`Outcome` out.

The driver (:mod:`modelvec.run.pipeline`) decides what needs computing and writes the store; an
engine (:mod:`modelvec.run.engines`) takes a stream of tasks (one model each, small and
picklable) and yields one outcome per task (a vector, or the one-line reason it failed and its
kind). Every engine runs the same :func:`compute`, so a vector does not depend on where it was
computed.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..core.errors import Kind, ModelvecError, error_of
from ..core.files import weight_format
from ..core.gguf import gguf_weights
from ..hub.cache import release, repo_folder, snapshot_folder
from ..hub.cards import ModelCard, model_card
from ..hub.client import HubSettings
from ..hub.download import fetch, fetch_runnable
from ..hub.partial import PartialFolder, open_partial, release_partial
from ..read import open_checkpoint
from ..represent.representation import Representation
from ..represent.trace import Trace

if TYPE_CHECKING:
    from ..read import Checkpoint
    from ..represent import DeltaEmbedder
    from ..represent.probe import ProbeInputs
    from ..represent.sketching import Parent

#: The stored rows of each tensor a model's vector reads (tensor -> row ranges): :func:`~modelvec.represent.read_plan`.
ReadPlan = dict[str, list[tuple[int, int]]]


@dataclass(frozen=True)
class BaseSpec:
    """How any worker opens the base: a local path, or a Hub repo pinned to a sha. ``version`` is what its vectors are
    stored against (``base_hash``): a Hub base's ``git:<sha>``, a local one's content fingerprint."""

    name: str
    version: str
    path: str | None = None
    repo: str | None = None
    sha: str | None = None
    #: the store that keeps the base's probe inputs beside it (``Representation.probe``): read where they verify,
    #: else made and kept (None: made in memory)
    store: str | None = None

    def open(self, hub_settings: HubSettings, representation: Representation | None = None) -> Checkpoint:
        """The base's checkpoint; from the Hub, only what ``representation`` reads (see :func:`open_hub`)."""
        from ..read import Checkpoint

        if self.path is not None:
            return Checkpoint(self.path, name=self.name)
        hub = open_hub(str(self.repo), str(self.sha), None, self.name, hub_settings, representation, base=True)
        return hub.checkpoint

    def runnable(self, hub_settings: HubSettings) -> Path:
        """A folder with the base whole, its configuration and tokenizer: what running it needs (from the Hub, all of
        its weights: once, for the probe)."""
        if self.path is not None:
            path = Path(self.path)
            return path if path.is_dir() else path.parent
        return fetch_runnable(str(self.repo), str(self.sha), hub_settings)

    def probe_inputs(
        self, ck: Checkpoint, representation: Representation, hub_settings: HubSettings
    ) -> ProbeInputs | None:
        """The base's inputs on the probe (None: ``representation`` takes no probe for this family): kept ones where
        they verify and were made for this base and probe, else computed (and kept, where a store keeps them)."""
        from ..represent.probe import compute_inputs
        from ..store.derived.inputs import inputs_meta, inputs_path, read_inputs, write_inputs

        layout = ck.layout()
        tokens = representation.probe_tokens(layout.arch.probe)
        if tokens is None:
            return None
        meta = inputs_meta(self.name, self.version, tokens)
        path = inputs_path(self.store, self.name, tokens) if self.store is not None else None
        if path is not None:
            inputs, _why = read_inputs(path, meta)  # one that does not verify is made again
            if inputs is not None:
                return inputs
        inputs = compute_inputs(self.runnable(hub_settings), layout, tokens, self.name)
        if path is not None:
            write_inputs(path, meta, inputs)
        return inputs


@dataclass(frozen=True)
class Task:
    """One model to embed: its store name and version (what its vector is stored with, ``model_hash``: a Hub model's
    ``git:<sha>``, a local one's files' stamp), where its files are, and known labels."""

    name: str
    version: str
    source: str
    path: str | None = None
    repo: str | None = None  # a Hub model, fetched at ``sha``
    sha: str | None = None
    files: tuple[str, ...] = ()
    datasets: tuple[str, ...] | None = None  # None: read them from the model card
    label_source: str | None = None
    author: str | None = None
    #: the fine-tune a LoRA adapter was trained on, where it is not the base: the adapter is embedded on its delta
    parent: Task | None = None
    relation: str | None = None  # a Hub model's card, as its catalogue entry says: its relation to its parents
    parents: tuple[str, ...] = ()  # and the parents it names
    created: str | None = None  # when it was made: the Hub's date, a local model's files' oldest time (ISO)
    files_id: str | None = None  # a local model's weight files, resolved (:func:`files_id`): the same files, one model

    def open(self, hub_settings: HubSettings, representation: Representation | None = None) -> Opened:
        """The model's checkpoint; from the Hub, only what ``representation`` reads (see :func:`open_hub`), carrying
        the read plan that chose those bytes."""
        if self.repo is not None:
            files = list(self.files) or None
            return open_hub(self.repo, str(self.sha), files, self.name, hub_settings, representation, base=False)
        return Opened(open_checkpoint(str(self.path), name=self.name))

    def card(self, folder: Path | None = None) -> ModelCard:
        """What its card says: a Hub model's as its catalogue entry has it, a local one's read from ``folder`` (its
        checkpoint's; default: where its files are)."""
        if self.datasets is not None:
            return ModelCard(
                None, list(self.datasets), self.label_source, self.author, self.relation, list(self.parents), None
            )
        if folder is None:
            path = Path(str(self.path))
            folder = path if path.is_dir() else path.parent
        return model_card(folder, self.name)

    def release(self, hub_settings: HubSettings) -> None:
        """Delete a Hub model's fetched files (a local model is left alone); a failure to delete only warns."""
        if self.repo is not None:
            try:
                release(self.repo, str(self.sha), hub_settings)
                release_partial(self.repo, str(self.sha), hub_settings)
            except OSError as exc:
                warnings.warn(f"{self.name}: could not delete its cached files: {exc}", stacklevel=2)


#: What a model fetched whole although the representation reads a share of rows says, once per run.
WHOLE_BIN = "pickled .bin weights cannot be read by byte ranges: downloaded whole"
WHOLE_SERVED = "the Hub answered a range request with the whole file: downloaded whole"


def open_hub(
    repo: str,
    sha: str,
    files: list[str] | None,
    name: str,
    hub_settings: HubSettings,
    representation: Representation | None,
    *,
    base: bool,
) -> Opened:
    """A Hub model at commit ``sha``, fetched as ``representation`` needs it.

    Where the representation reads a share of rows and the weights are safetensors, or the repository's weights are
    GGUF (the finest of its quantizations: :func:`~modelvec.core.gguf.gguf_weights`), only those rows' byte ranges
    come (a partial download: :mod:`modelvec.hub.partial`), unless a whole snapshot is already in the cache: the
    checkpoint is opened once, its read plan and the plan's byte ranges are worked out once, from the
    headers the fetch parsed, and the checkpoint carries them (``checkpoint.reads``) to whatever reads it next.
    Otherwise the files come whole (:func:`~modelvec.hub.download.fetch`); ``checkpoint.note`` then says why,
    where a share was asked for (a pickled ``.bin``; a server that ignored ``Range``).
    """
    reads_rows = representation is not None and representation.reads_share
    cached = _has_weights(snapshot_folder(repo, sha, hub_settings))
    ggufs = files is not None and weight_format(files) is None and gguf_weights(files) is not None
    if (reads_rows or (ggufs and representation is not None)) and not cached:  # a GGUF: by ranges, whatever is read
        folder = open_partial(repo, sha, files, hub_settings)  # the headers, in a sparse folder
        if folder is not None:
            return Opened(_fill(folder, name, representation, base, hub_settings))  # type: ignore[arg-type]
    ck = open_checkpoint(fetch(repo, sha, files, hub_settings), name=name)
    if reads_rows and not cached and not ck.factored:
        ck.note = WHOLE_BIN
    return Opened(ck)


def plan_of(ck: Checkpoint, representation: Representation, *, base: bool) -> ReadPlan:
    """The model's read plan (:func:`~modelvec.represent.read_plan`): worked out once per model in a run, here."""
    from ..represent.blocks import read_plan

    return read_plan(ck, representation, base=base)


def _fill(
    folder: PartialFolder, name: str, representation: Representation, base: bool, hub_settings: HubSettings
) -> Checkpoint:
    """The partial ``folder`` opened once (with the headers its fetch parsed), its read plan and the plan's byte
    ranges worked out once (:meth:`~modelvec.read.checkpoint.Checkpoint.plan_reads`), those bytes fetched, and what
    it then holds read from its marker."""
    ck = open_checkpoint(folder.opens(), name=name)
    ck.take_headers({file: (header.data_start, header.header) for file, header in folder.headers.items()})
    spans = ck.plan_reads(plan_of(ck, representation, base=base))
    got = folder.fill({f.name: s for f, s in (spans or {}).items()}, hub_settings)
    ck.refresh_held()
    ck.note = WHOLE_SERVED if got.whole_files else None
    return ck


def _has_weights(folder: Path | None) -> bool:
    """Whether a cached snapshot holds a model's weights (not only the config a partial download took)."""
    if folder is None:
        return False
    try:
        open_checkpoint(folder)
    except ModelvecError:
        return False
    return True


@dataclass(kw_only=True)
class Outcome:
    """What became of one task: a vector, or the reason it failed.

    ``kind`` is the failure's (:class:`~modelvec.core.errors.Kind`): a ``content`` failure is kept with
    the model's version, so the same files are not fetched again; ``transient`` (network, access)
    and ``resource`` (memory, disk) failures are tried again next run.
    """

    task: Task
    vector: np.ndarray | None = None
    architecture: str | None = None
    datasets: list[str] = field(default_factory=list)
    label_source: str | None = None
    author: str | None = None
    seconds: float = 0.0
    adapter: bool | None = None  # the model is a LoRA adapter (its delta in factored form), not a full fine-tune
    quantized: str | None = None  # the block-quantized types its weights are stored in (a GGUF's Q4_K...), if any
    error: str | None = None
    kind: Kind = Kind.CONTENT
    note: str | None = None  # how the model was read, when a run should say so (once): see open_hub
    card: ModelCard | None = None  # what the model's card says (its labels, relation, parents, hash)
    fetched: int = 0  # bytes of the model's files this run brought from the Hub (0: local, or already cached)
    trace: Trace | None = None  # what the model tree is inferred from (see modelvec.represent.trace)


@dataclass
class Opened:
    """A task's checkpoint, opened, and the bytes that opening it brought from the Hub (for a progress display). The
    checkpoint carries its read plan where one was worked out (``checkpoint.reads``: a Hub model read by byte
    ranges; a model whose reads are prefetched), with the plan's byte ranges, so that nothing works them out again."""

    checkpoint: Checkpoint
    fetched: int = 0


def open_counted(task: Task, hub_settings: HubSettings, representation: Representation | None) -> Opened:
    """``task.open``, with the bytes it brought into the Hub cache: what the model cost on the wire, where the
    download happens (an engine's worker), whatever route the files took (whole, or byte ranges)."""
    if task.repo is None:
        return task.open(hub_settings, representation)
    folder = repo_folder(task.repo, hub_settings)
    before = _bytes_under(folder)
    opened = task.open(hub_settings, representation)
    opened.fetched = max(0, _bytes_under(folder) - before)
    return opened


def _bytes_under(folder: Path) -> int:
    """The bytes held by the files under ``folder`` (not following links); a sparse partial download counts only
    the ranges it holds."""
    total = 0
    for path, _, names in os.walk(folder):
        for name in names:
            try:
                st = os.lstat(os.path.join(path, name))
            except OSError:  # deleted meanwhile (a finished download's temporary file)
                continue
            if not os.path.islink(os.path.join(path, name)):
                total += min(st.st_size, st.st_blocks * 512)
    return total


def fit_base(base: BaseSpec, representation: Representation, device: str, hub_settings: HubSettings) -> DeltaEmbedder:
    """The embedder with the base's matrices read (once per engine worker)."""
    from ..represent import DeltaEmbedder

    ck = base.open(hub_settings, representation)
    inputs = base.probe_inputs(ck, representation, hub_settings)
    return DeltaEmbedder.from_representation(representation, device).fit(ck, inputs)


def compute(
    task: Task,
    embedder: DeltaEmbedder,
    open_model: Callable[[], Opened],
    hub_settings: HubSettings | None = None,
) -> Outcome:
    """Embed one model. The model's own faults become the outcome's error and kind; a fault of the base raises.

    ``open_model`` opens the model (fetching it first: :func:`open_counted`), and says what the fetch cost;
    ``hub_settings`` are how an adapter's parent fine-tune is fetched (``task.parent``), where the embedder does not
    hold its rows already."""
    start = time.perf_counter()
    fetched = 0
    try:
        opened = open_model()
        ck, fetched = opened.checkpoint, opened.fetched
        try:
            embedded = embedder.embed_traced(ck, _parent_of(task, embedder, hub_settings))
            card = task.card(ck.folder)
            note, adapter = ck.note, bool(ck.factored)
            quantized = ",".join(ck.quantized_types()) or None
        finally:
            ck.close()
    except Exception as exc:  # a run over many models goes on; the reason is kept
        err = error_of(exc, task.name)
        if err.model == embedder.base_.name and err.kind is Kind.CONTENT:  # the base is broken: nothing can be embedded
            raise err from exc
        return Outcome(task=task, error=str(err), kind=err.kind, seconds=time.perf_counter() - start, fetched=fetched)
    return Outcome(
        task=task,
        vector=embedded.vector,
        architecture=embedder.layout_.arch.name,
        datasets=card.datasets,
        label_source=card.label_source,
        author=card.author,
        seconds=time.perf_counter() - start,
        adapter=adapter,
        quantized=quantized,
        note=note,
        card=card,
        fetched=fetched,
        trace=embedded.trace,
    )


def _parent_of(task: Task, embedder: DeltaEmbedder, hub_settings: HubSettings | None) -> Parent | None:
    """The parent fine-tune of an adapter task, as the embedder keeps its rows: by its name and version, opened only
    where they are not kept (its fault is the adapter's, of the same kind, naming the parent)."""
    from ..represent.sketching import Parent

    parent = task.parent
    if parent is None:
        return None

    def open_parent() -> Checkpoint:
        try:
            return parent.open(hub_settings or HubSettings(), embedder.representation).checkpoint
        except Exception as exc:  # the parent's fault, said as the parent's, of its kind (gone, gated, a bad file)
            err = error_of(exc, parent.name)
            raise ModelvecError(task.name, f"its parent {parent.name}: {err.cause}", kind=err.kind) from exc

    return Parent(f"{parent.name}@{parent.version}", open_parent)


def files_id(ck: Checkpoint) -> str:
    """A local model's weight files as this machine resolves them (an xxh3 of their real paths): a folder and its
    weights file, or a link to either, name the same files, so one model."""
    import xxhash

    return "files:" + xxhash.xxh3_64_hexdigest("\n".join(sorted(str(f.resolve()) for f in ck.files)).encode())
