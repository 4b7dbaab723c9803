"""Talking to the Hugging Face Hub: base ids, settings, and retries with backoff.

Everything goes through ``huggingface_hub`` (``HfApi``, ``hf_hub_download``), so ``HF_ENDPOINT``,
``HF_TOKEN`` / ``hf auth login``, ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE`` mean what they mean to
any Hub user. The client retries some calls itself (listings, the body of a download on 429) but
not others (``model_info``, the HEAD before a download), so every call modelvec makes goes through
:func:`with_retries`: 429, 5xx, timeouts, dropped connections, truncated transfers and downloads whose
bytes do not match their announced size or sha256 are retried with exponential backoff (honouring
``Retry-After``); anything else fails at once, and :func:`describe_error` says in one line what went
wrong and after how many tries.

Names from the Hub are not trusted as file names: huggingface_hub (2.4) builds cache paths from the
``ETag`` and ``X-Repo-Commit`` headers of a file's HEAD and from the revision it is asked for, so a
hostile endpoint (a mirror in ``HF_ENDPOINT``, a proxy) answering ``ETag: "../../../x"``, or a listing
whose ``sha`` is ``../../../x``, would make it write outside the cache. :func:`guard_hub_client`
(installed by the first :func:`with_retries`) makes huggingface_hub's HTTP client refuse both, through
its public ``set_client_factory``.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar
from urllib.parse import unquote

import httpx2
from huggingface_hub import HfApi, constants
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

T = TypeVar("T")

#: The description's short ids and the Hub's canonical ids (the Hub moved legacy ids under orgs).
#: A short id resolves to its canonical one; any other ``org/name`` is taken as written.
CANONICAL_BASES: dict[str, str] = {
    "bert-base-uncased": "google-bert/bert-base-uncased",
    "bert-base-cased": "google-bert/bert-base-cased",
    "bert-large-uncased": "google-bert/bert-large-uncased",
    "bert-large-cased": "google-bert/bert-large-cased",
    "bert-base-multilingual-cased": "google-bert/bert-base-multilingual-cased",
    "bert-base-multilingual-uncased": "google-bert/bert-base-multilingual-uncased",
    "roberta-base": "FacebookAI/roberta-base",
    "roberta-large": "FacebookAI/roberta-large",
    "xlm-roberta-base": "FacebookAI/xlm-roberta-base",
    "xlm-roberta-large": "FacebookAI/xlm-roberta-large",
    "distilbert-base-uncased": "distilbert/distilbert-base-uncased",
    "distilbert-base-cased": "distilbert/distilbert-base-cased",
    "distilroberta-base": "distilbert/distilroberta-base",
    "t5-small": "google-t5/t5-small",
    "t5-base": "google-t5/t5-base",
    "t5-large": "google-t5/t5-large",
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
    "distilgpt2": "distilbert/distilgpt2",
    "all-MiniLM-L6-v2": "sentence-transformers/all-MiniLM-L6-v2",
}
_SHORT_BY_CANONICAL = {v.lower(): k for k, v in CANONICAL_BASES.items()}
_SHORT_BY_LOWER = {k.lower(): v for k, v in CANONICAL_BASES.items()}

RETRY_STATUS = (408, 429, 500, 502, 503, 504)
_SHA = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class BaseId:
    """A base model as the Hub knows it: the canonical id and the names fine-tunes use for it."""

    canonical: str
    short: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """Every id a card's ``base_model:`` may use for this base (canonical first)."""
        return (self.canonical,) + ((self.short,) if self.short else ())

    @property
    def search_term(self) -> str:
        """The name fine-tunes of 2020-22 put in their repo names: ``bert-base-uncased``."""
        return self.short or self.canonical.split("/", 1)[-1]


def resolve_base(base: str) -> BaseId:
    """``bert-base-uncased`` and ``google-bert/bert-base-uncased`` both give the same :class:`BaseId`."""
    text = base.strip().strip("/")
    if not text:
        raise ValueError("empty base model id")
    if text.lower() in _SHORT_BY_LOWER:
        canonical = _SHORT_BY_LOWER[text.lower()]
        return BaseId(canonical, _SHORT_BY_CANONICAL[canonical.lower()])
    if text.lower() in _SHORT_BY_CANONICAL:
        short = _SHORT_BY_CANONICAL[text.lower()]
        return BaseId(CANONICAL_BASES[short], short)
    return BaseId(text, None)


def is_commit_sha(revision: str | None) -> bool:
    return bool(revision) and bool(_SHA.fullmatch(str(revision)))


@dataclass(frozen=True)
class HubSettings:
    """Where and how to reach the Hub; every field defaults to what huggingface_hub itself would use.

    ``token=None`` uses the logged-in token (``hf auth login`` or ``HF_TOKEN``), if any.
    ``retries`` and ``backoff`` (first wait, seconds; doubled each time, at most ``max_wait``)
    apply to every call; ``MODELVEC_HUB_BACKOFF`` overrides the first wait (tests use a small one).
    ``timeout`` (seconds, ``MODELVEC_HUB_TIMEOUT``, default huggingface_hub's ``HF_HUB_ETAG_TIMEOUT``)
    bounds each metadata call (``model_info``, the HEAD before a download), which huggingface_hub
    would otherwise let hang on a stalled server; a download's body is bounded between reads by
    ``HF_HUB_DOWNLOAD_TIMEOUT``, as for any huggingface_hub user.
    """

    endpoint: str | None = None
    token: str | bool | None = None
    cache_dir: str | None = None
    retries: int = 5
    backoff: float = field(default_factory=lambda: float(os.environ.get("MODELVEC_HUB_BACKOFF", "1.0")))
    max_wait: float = 30.0
    timeout: float = field(default_factory=lambda: float(os.environ.get("MODELVEC_HUB_TIMEOUT",
                                                                        constants.HF_HUB_ETAG_TIMEOUT)))

    def api(self) -> HfApi:
        """An ``HfApi`` whose ``model_info`` times out after :attr:`timeout` unless told otherwise."""
        return _Api(endpoint=self.endpoint, token=self.token, timeout=self.timeout)

    @property
    def offline(self) -> bool:
        return bool(constants.is_offline_mode())


class _Api(HfApi):
    def __init__(self, *args, timeout: float | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._timeout = timeout

    def model_info(self, *args, timeout: float | None = None, **kwargs):  # type: ignore[override]
        return super().model_info(*args, timeout=self._timeout if timeout is None else timeout, **kwargs)


class CorruptDownload(OSError):
    """A downloaded file's bytes do not match the sha256 the Hub announced for it (its ETag); retried."""


class UnsafeHubName(ValueError):
    """A name from the Hub that huggingface_hub would use in a cache path (a revision asked for, an ETag or a
    commit answered) could lead outside the cache."""


#: Headers of a file's HEAD that huggingface_hub turns into cache paths (blobs/<etag>, snapshots/<commit>,
#: .no_exist/<commit>/...).
_PATH_HEADERS = ("ETag", "X-Linked-Etag", "X-Repo-Commit")
_GUARD_LOCK = threading.Lock()
_guarded_factory = None


def _unsafe_name(value: str) -> bool:
    return (not value or value in (".", "..") or len(value) > 255
            or any(c in "/\\:" or ord(c) < 32 or ord(c) == 127 for c in value))


def check_request(request) -> None:
    """Refuse to resolve a file at a revision that is no git ref and would be a path (an httpx request hook).

    huggingface_hub stores ``refs/<revision>`` in the cache for the revision it is asked for; git refs never
    hold ``..`` segments, backslashes or control characters, nor start with ``/``.
    """
    if request.method not in ("HEAD", "GET"):
        return
    segments = request.url.raw_path.split(b"?", 1)[0].decode("ascii", "replace").split("/")
    for i, segment in enumerate(segments[:-1]):
        if segment == "resolve":
            revision = unquote(segments[i + 1])
            if (revision.startswith("/") or any(p in ("", ".", "..") for p in revision.split("/"))
                    or any(c == "\\" or ord(c) < 32 or ord(c) == 127 for c in revision)):
                raise UnsafeHubName(f"refused to ask for revision {revision[:80]!r}, which is no git ref")


def check_answer(response) -> None:
    """Refuse a HEAD answer whose ETag or commit header would not be a plain file name (an httpx response hook)."""
    if response.request.method != "HEAD":
        return
    for header in _PATH_HEADERS:
        value = response.headers.get(header)
        if value is None:
            continue
        name = value.lstrip("W/").strip('"') if "etag" in header.lower() else value  # as huggingface_hub reads it
        if _unsafe_name(name):
            raise UnsafeHubName(f"the Hub answered {header}: {value[:80]!r} for {response.request.url.path[:200]}, "
                                "which is not a safe file name; refused")


def guard_hub_client() -> None:
    """Make huggingface_hub's shared HTTP client check requests and answers (:func:`check_request`,
    :func:`check_answer`).

    Installed through ``huggingface_hub.set_client_factory`` around the factory in place (the default one, or
    the user's), and again if something replaces it later; if huggingface_hub's internals change, the hook is
    added to the current shared client instead. Idempotent and thread-safe; cheap once installed.
    """
    global _guarded_factory
    from huggingface_hub import get_session, set_client_factory
    from huggingface_hub.utils import _http

    installed = getattr(_http, "_GLOBAL_CLIENT_FACTORY", None)
    if installed is not None and installed is _guarded_factory:
        return
    with _GUARD_LOCK:
        installed = getattr(_http, "_GLOBAL_CLIENT_FACTORY", None)
        if installed is not None and installed is _guarded_factory:
            return
        if installed is None:  # not the huggingface_hub this was written for: hook the live client
            client = get_session()
            if check_answer not in client.event_hooks.get("response", []):
                _add_hook(client)
            return

        def factory():
            return _add_hook(installed())

        set_client_factory(factory)
        _guarded_factory = factory


def _add_hook(client):
    hooks = dict(client.event_hooks)
    hooks["request"] = [*hooks.get("request", []), check_request]
    hooks["response"] = [*hooks.get("response", []), check_answer]
    client.event_hooks = hooks
    return client


def _chain(exc: BaseException):
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def transient(exc: BaseException) -> bool:
    """Whether retrying may help: rate limits, server errors, timeouts, dropped or short transfers."""
    for e in _chain(exc):
        if isinstance(e, OfflineModeIsEnabled):
            return False
        if isinstance(e, HfHubHTTPError) and e.response is not None:
            return e.response.status_code in RETRY_STATUS
        if isinstance(e, (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError, CorruptDownload)):
            return True
        if isinstance(e, OSError) and "Consistency check failed" in str(e):
            return True
    return False


def _retry_after(exc: BaseException) -> float | None:
    for e in _chain(exc):
        if isinstance(e, HfHubHTTPError) and e.response is not None:
            value = e.response.headers.get("Retry-After")
            try:
                return float(value) if value is not None else None
            except ValueError:
                return None
    return None


def with_retries(call: Callable[[], T], settings: HubSettings, what: str,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """``call()``, retried on transient failures with exponential backoff and jitter.

    ``Retry-After`` is honoured (capped at ``max_wait``). After the last try the error is raised, with
    the number of tries it came after in its ``modelvec_tries`` attribute (for :func:`describe_error`).
    """
    guard_hub_client()
    wait = settings.backoff
    for attempt in range(settings.retries + 1):
        try:
            return call()
        except Exception as exc:
            if attempt >= settings.retries or not transient(exc):
                try:
                    exc.modelvec_tries = attempt + 1  # type: ignore[attr-defined]
                except AttributeError:  # pragma: no cover - exceptions with __slots__
                    pass
                raise
            pause = _retry_after(exc)
            pause = min(settings.max_wait, pause if pause is not None else wait * (1 + 0.25 * random.random()))
            sleep(pause)
            wait = min(settings.max_wait, wait * 2)
    raise AssertionError("unreachable")  # pragma: no cover


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else ""


def describe_error(exc: BaseException) -> str:
    """The cause of a failed Hub call in one line, with how many tries it took, for the failures table."""
    from huggingface_hub.errors import (
        GatedRepoError, HFValidationError, LocalEntryNotFoundError, RemoteEntryNotFoundError, RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    tries = next((e.modelvec_tries for e in _chain(exc) if isinstance(getattr(e, "modelvec_tries", None), int)), 1)
    after = f" after {tries} tries" if tries > 1 else ""
    for e in _chain(exc):
        if isinstance(e, GatedRepoError):
            return "gated repository: request access on the Hub and log in (hf auth login or HF_TOKEN)"
        if isinstance(e, RepositoryNotFoundError):
            return "repository not found (or private without a token)"
        if isinstance(e, RevisionNotFoundError):
            return "revision not found"
        if isinstance(e, RemoteEntryNotFoundError):
            return "file not found in the repository"
        if isinstance(e, OfflineModeIsEnabled) or (isinstance(e, LocalEntryNotFoundError) and constants.is_offline_mode()):
            return "offline (HF_HUB_OFFLINE=1) and not in the local cache"
        if isinstance(e, HfHubHTTPError) and e.response is not None:
            return f"HTTP {e.response.status_code} from the Hub{after}"
        if isinstance(e, UnsafeHubName):
            return f"unsafe name from the Hub: {_first_line(e)}"
        if isinstance(e, HFValidationError):
            return f"invalid repository id or revision: {_first_line(e)}"
        if isinstance(e, httpx2.TimeoutException):
            return f"timed out{after} ({type(e).__name__})"
        if isinstance(e, httpx2.NetworkError):
            return f"connection failed{after} ({type(e).__name__}: {_first_line(e)})".replace(": )", ")")
        if isinstance(e, httpx2.RemoteProtocolError):
            return f"connection dropped mid-answer{after} ({_first_line(e)})"
        if isinstance(e, CorruptDownload):
            return f"downloaded bytes do not match their sha256{after}: {_first_line(e)}"
        if isinstance(e, OSError) and "Consistency check failed" in str(e):
            return f"download of the wrong size{after}: {_first_line(e)}"
    return f"{type(exc).__name__}: {_first_line(exc)}".rstrip(": ")
