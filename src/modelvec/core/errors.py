"""One error model: every failure is a :class:`ModelvecError` with a kind that says what to do about it.

- ``content``: this file is bad (a truncated shard, NaN weights, an unknown architecture). Recorded
  with the model's identity and skipped on a re-run while the weights are unchanged.
- ``transient``: the world is flaky (network, timeouts, a busy store). Retried with backoff where
  that can help; never recorded as a property of the model, so the next run tries again.
- ``resource``: the machine is too small (out of memory on CPU or GPU, disk full). Recorded as such
  and retried on the next run; a GPU computation is first retried in smaller pieces or on the CPU.

``str(err)`` is always one line, ``"<model>: <cause>"``, so a run over many models can record it
and go on. :func:`error_of` turns any exception into one; stages that know their third-party
errors (the Hub client, Ray) teach it with :func:`register_explainer`, so this module imports none
of them. Errors pickle with their fields: they cross Ray and process boundaries.
"""

from __future__ import annotations

import errno
import json
import re
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any, ClassVar


class Kind(str, Enum):  # noqa: UP042  (str() and format() as an Enum's: the reports' words)
    """What a failure says about the model, and so what a later run does with it."""

    CONTENT = "content"  # the files are bad: skipped while they are unchanged
    TRANSIENT = "transient"  # the world is flaky: retried, never a property of the model
    RESOURCE = "resource"  # the machine is too small: recorded, retried next run


class ModelvecError(Exception):
    """A failure about one model (or store); ``str(err)`` is ``"<model>: <cause>"`` on one line.

    ``kind`` defaults to the class's; an instance may say otherwise (``kind=...``).
    """

    default_kind: ClassVar[Kind] = Kind.CONTENT

    def __init__(self, model: str, cause: str, *, kind: Kind | str | None = None) -> None:
        self.model = model
        self.cause = cause
        self.kind = Kind(kind) if kind is not None else self.default_kind
        super().__init__(f"{shown(model, None)}: {shown(cause, None)}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickles its args (the one formatted message); rebuild from the fields instead.
        return (_rebuild, (type(self), self.model, self.cause, self.kind.value), self.__dict__.copy())

    @property
    def retry_next_run(self) -> bool:
        """Whether a later run should try this model again (everything but a content failure)."""
        return self.kind is not Kind.CONTENT


def _rebuild(cls: type[ModelvecError], model: str, cause: str, kind: str) -> ModelvecError:
    err = cls.__new__(cls)
    ModelvecError.__init__(err, model, cause, kind=kind)
    return err


class CheckpointError(ModelvecError):
    """The checkpoint cannot be read: missing files, bad format, missing tensor, NaN/Inf."""


class ArchitectureError(ModelvecError):
    """The architecture is unknown or its config cannot tell which family it is."""


class IncompatibleError(ModelvecError):
    """A fine-tune does not match its base: another family or another matrix shape."""


class TransientError(ModelvecError):
    """The world failed, not the model: a network error, a timeout, a store busy for too long."""

    default_kind = Kind.TRANSIENT


class FetchError(TransientError):
    """A model's files could not be fetched (network, gated, not found, offline and not cached, unsafe names)."""


class ResourceError(ModelvecError):
    """The machine was too small for this model: out of memory (CPU or GPU) or out of disk."""

    default_kind = Kind.RESOURCE


class DeviceError(ResourceError, ValueError):
    """The device asked for is not on this machine (CUDA without a visible GPU): the machine's, said in one line,
    and a ``ValueError`` to those that check the device as a value."""


class HeaderFault(ValueError):
    """What is wrong with a safetensors file's header, in a few words, where the model is not known
    (:mod:`modelvec.core.safetensors`): the file's fault (``kind`` content); the reader says it as a
    :class:`CheckpointError` of the model."""

    kind: ClassVar[Kind] = Kind.CONTENT


class QuantFault(ValueError):
    """A quantized linear's tensors that do not fit together, in a few words naming the tensor
    (:mod:`modelvec.read.quant_schemes`): the file's fault (``kind`` content), said as a :class:`CheckpointError`."""

    kind: ClassVar[Kind] = Kind.CONTENT


class GGUFFault(ValueError):
    """What is wrong with a GGUF file's header, in a few words, where the model is not known
    (:mod:`modelvec.core.gguf`): the file's fault (``kind`` content), said as a :class:`CheckpointError` of the model."""

    kind: ClassVar[Kind] = Kind.CONTENT


class NeedMore(Exception):
    """A buffer ends inside a GGUF header: at least ``size`` bytes from the file's start are needed, and about
    ``estimate`` where it ends inside an array of strings (the vocabulary: the rest at the mean length so far). Only a
    fetcher sees it (it asks for the bytes); ``kind`` content where it escapes: the file ends in its header."""

    kind: ClassVar[Kind] = Kind.CONTENT

    def __init__(self, size: int, estimate: int = 0) -> None:
        super().__init__(size)
        self.size, self.estimate = size, max(size, estimate)


class MarkerFault(ValueError):
    """A partial download's marker that cannot be read (:mod:`modelvec.core.partial`), in a few words, where the
    model is not known: the reader says it as a :class:`CheckpointError` of the model (``kind`` content); the fetcher
    makes the folder again."""

    kind: ClassVar[Kind] = Kind.CONTENT


class AnswerError(Exception):
    """A Hub answer refused inside the HTTP machinery, where the model is not known yet: the world failed
    (``kind`` transient), never the model. Raised as itself so that the call can be retried; the Hub client's
    explainer turns it into a one-line :class:`TransientError` of the model (:func:`error_of`)."""

    kind: ClassVar[Kind] = Kind.TRANSIENT


class CorruptDownload(AnswerError):
    """Downloaded bytes do not match the sha256 the Hub announced for them (their ETag): retried."""


class BadRangeAnswer(CorruptDownload):
    """An answer to a range request that is not the bytes asked for: another status, another range or file size in
    ``Content-Range``, a body shorter or longer than the range. Retried, as a corrupt download is."""


class HubRefused(ConnectionError):
    """The Hub's endpoint refused connections (nothing listens there): said in one line, never retried with backoff;
    every later call of the process to that endpoint raises it at once (:mod:`modelvec.hub.client`). The world
    failed, not the model: each model left is recorded transient."""

    kind: ClassVar[Kind] = Kind.TRANSIENT


class UnsafeHubName(AnswerError, ValueError):
    """A name from the Hub (a revision asked for, an ETag or commit answered, a cached listing) that
    huggingface_hub would use in a cache path and that could lead outside the cache: refused."""


class StoreError(ModelvecError):
    """The store itself is damaged: a vector file that is not ours, truncated, or whose bytes changed (content)."""


class StoreLockedError(TransientError):
    """Another process still held the store's lock when ``Store(path, wait=...)`` gave up waiting for it."""

    def __init__(self, path: Any, pid: int | None, waited: float) -> None:
        self.path, self.pid, self.waited = path, pid, waited
        holder = f"another process (PID {pid})" if pid is not None else "another process"
        super().__init__(
            str(path),
            f"still in use by {holder} after waiting {waited:g} s; let it finish, "
            "or wait longer (--wait SECONDS, $MODELVEC_STORE_WAIT)",
        )


class NothingStoredError(ModelvecError, LookupError):
    """What a command reads is not in the store (no vectors of this base or representation): the message says what
    is stored instead, or what to run first."""


# --- untrusted text in one line -----------------------------------------------------------------------


def shown(value: Any, limit: int | None = 80) -> str:
    """Untrusted text (a name from a file or the Hub, a value from a header) fit for a one-line
    message: as is when printable, else escaped; cut to about ``limit`` characters (None: never)."""
    text = value if isinstance(value, str) else json.dumps(value)
    if text.isprintable() and (limit is None or len(text) <= limit):
        return text
    if limit is None:
        return repr(text)
    escaped = repr(text[:limit])  # escapes can make it 4 times longer: cut what is shown
    return escaped if len(text) <= limit and len(escaped) <= limit + 2 else escaped[:limit] + "..."


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def first_line(exc: BaseException, limit: int = 160) -> str:
    """A third-party error as a short clause: its first line (no ANSI colours), shown safely."""
    text = _ANSI.sub("", str(exc)).strip()
    return shown(text.splitlines()[0] if text else type(exc).__name__, limit)


# --- any exception as a ModelvecError -----------------------------------------------------------------

Explainer = Callable[[BaseException], "tuple[Kind, str] | None"]
_EXPLAINERS: list[Explainer] = []

#: How out-of-memory reads in the messages of torch, numpy and the OS, CPU and GPU alike.
_OOM = re.compile(
    r"out of memory|can't allocate memory|cannot allocate memory|failed to allocate|"
    r"DefaultCPUAllocator|CUBLAS_STATUS_ALLOC_FAILED|std::bad_alloc|can't start new thread",
    re.IGNORECASE,
)
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def register_explainer(explain: Explainer) -> None:
    """Teach :func:`error_of` a family of third-party errors: ``explain(exc)`` gives (kind, cause) or None."""
    if explain not in _EXPLAINERS:
        _EXPLAINERS.append(explain)


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during, nearest first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def resource_cause(exc: BaseException) -> str | None:
    """Why ``exc`` (or what it was raised from) means the machine was too small; None when it does not."""
    for e in chain(exc):
        name = type(e).__name__
        if isinstance(e, MemoryError) or name == "OutOfMemoryError":  # torch.OutOfMemoryError (CPU or CUDA)
            return f"out of memory ({first_line(e, 120)})"
        if isinstance(e, OSError) and e.errno == errno.ENOMEM:
            return f"out of memory ({first_line(e, 120)})"
        if isinstance(e, OSError) and e.errno in _NO_SPACE:
            return f"out of disk space ({first_line(e, 120)})"
        if isinstance(e, RuntimeError | OSError) and _OOM.search(str(e)):  # OSError: old safetensors, no errno
            return f"out of memory ({first_line(e, 120)})"
    return None


def error_of(exc: BaseException, model: str) -> ModelvecError:
    """Any exception met while working on ``model`` as a :class:`ModelvecError` with its kind.

    A ``ModelvecError`` is returned as it is. Running out of memory or disk is ``resource``,
    whatever layer it surfaced in; then the registered explainers (the Hub client's, Ray's) are
    asked; ``TimeoutError`` and ``ConnectionError`` are ``transient``; anything else is a
    ``content`` failure named by its type and first line.
    """
    if isinstance(exc, ModelvecError):
        return exc
    resource = resource_cause(exc)
    if resource is not None:
        return ResourceError(model, resource)
    for explain in _EXPLAINERS:
        found = explain(exc)
        if found is not None:
            kind, cause = found
            cls = TransientError if kind is Kind.TRANSIENT else ModelvecError
            return cls(model, cause, kind=kind)
    if isinstance(exc, (TimeoutError, ConnectionError, AnswerError)):
        return TransientError(model, f"{type(exc).__name__}: {first_line(exc)}".rstrip(": "))
    return ModelvecError(model, f"{type(exc).__name__}: {first_line(exc)}".rstrip(": "))


def reason(exc: BaseException, model: str) -> str:
    """The one-line reason ``model`` failed, from any exception (``str(error_of(exc, model))``)."""
    return str(error_of(exc, model))


def raise_if_resource(exc: BaseException, model: str) -> None:
    """Re-raise ``exc`` as a :class:`ResourceError` when it means the machine was too small.

    For the places that turn a third-party failure into a content error (a file that cannot be
    read): "Cannot allocate memory" from mmap is the machine, not the file.
    """
    cause = resource_cause(exc)
    if cause is not None:
        raise ResourceError(model, cause) from exc
