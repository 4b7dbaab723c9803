"""Talking to the Hugging Face Hub: base ids, settings, and retries with backoff.

Everything goes through ``huggingface_hub`` (``HfApi``, ``hf_hub_download``), so ``HF_ENDPOINT``,
``HF_TOKEN`` / ``hf auth login``, ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE`` mean what they mean to
any Hub user. The client retries some calls itself (listings, the body of a download on 429) but
not others (``model_info``, the HEAD before a download), so every call modelvec makes goes through
:func:`with_retries`: 429, 5xx, timeouts, dropped connections and truncated transfers are retried
with exponential backoff (honouring ``Retry-After``); anything else fails at once.
"""

from __future__ import annotations

import os
import random
import re
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

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
    """

    endpoint: str | None = None
    token: str | bool | None = None
    cache_dir: str | None = None
    retries: int = 5
    backoff: float = field(default_factory=lambda: float(os.environ.get("MODELVEC_HUB_BACKOFF", "1.0")))
    max_wait: float = 30.0

    def api(self) -> HfApi:
        return HfApi(endpoint=self.endpoint, token=self.token)

    @property
    def offline(self) -> bool:
        return bool(constants.is_offline_mode())


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
        if isinstance(e, (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError)):
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

    ``Retry-After`` is honoured (capped at ``max_wait``). After the last try the error is raised.
    """
    wait = settings.backoff
    for attempt in range(settings.retries + 1):
        try:
            return call()
        except Exception as exc:
            if attempt >= settings.retries or not transient(exc):
                raise
            pause = _retry_after(exc)
            pause = min(settings.max_wait, pause if pause is not None else wait * (1 + 0.25 * random.random()))
            sleep(pause)
            wait = min(settings.max_wait, wait * 2)
    raise AssertionError("unreachable")  # pragma: no cover


def describe_error(exc: BaseException) -> str:
    """The cause of a failed Hub call in a few words, for one-line errors and the failures table."""
    from huggingface_hub.errors import (
        GatedRepoError, LocalEntryNotFoundError, RemoteEntryNotFoundError, RepositoryNotFoundError,
        RevisionNotFoundError,
    )

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
            return f"HTTP {e.response.status_code} from the Hub after retries"
        if isinstance(e, (httpx2.TimeoutException, httpx2.NetworkError)):
            return f"network error after retries: {type(e).__name__}"
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0] if first else ''}".rstrip(": ")
