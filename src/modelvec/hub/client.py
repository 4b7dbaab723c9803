"""Talking to the Hugging Face Hub: settings, and retries with backoff.

Everything goes through ``huggingface_hub`` (``HfApi``, ``hf_hub_download``, ``snapshot_download``), so
``HF_ENDPOINT``, ``HF_TOKEN`` / ``hf auth login``, ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE`` mean what they
mean to any Hub user. The client retries some calls itself (listings, the body of a download on 429) but
not others (``model_info``, the HEAD before a download), so every call modelvec makes goes through
:func:`with_retries`: 429, 5xx, timeouts, dropped connections, truncated transfers and downloads whose
bytes do not match their announced size or sha256 are retried with exponential backoff (honouring
``Retry-After``); anything else fails at once, and :func:`describe_error` says in one line what went
wrong and after how many tries. The first call also installs :func:`~modelvec.hub.guard.guard_hub_client`.
This module teaches :func:`modelvec.core.errors.error_of` the Hub's errors (all of them ``transient``:
the world failed, not the model).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from huggingface_hub import HfApi, constants
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

from ..core.constants import hub_backoff, hub_timeout
from ..core.errors import CorruptDownload, HubRefused, Kind, UnsafeHubName, chain, register_explainer
from ..core.settings import setting, setting_from, validate
from .guard import guard_hub_client
from .http import httpx2

T = TypeVar("T")
RETRY_STATUS = (408, 429, 500, 502, 503, 504)


@dataclass(frozen=True, kw_only=True)
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

    endpoint: str | None = setting(None, "The Hub's address (None: huggingface_hub's, HF_ENDPOINT).", kind=str)
    token: str | bool | None = setting(
        None, "The token sent (None: the logged-in one, if any; False: none).", kind=str, also=(bool,)
    )
    cache_dir: str | None = setting(None, "huggingface_hub's cache folder (None: HF_HUB_CACHE).", kind=str)
    retries: int = setting(5, "Times a failed call is tried again.", minimum=0)
    backoff: float = setting_from(
        hub_backoff, "Seconds before the first retry, doubled each time.", kind=float, minimum=0
    )
    max_wait: float = setting(30.0, "The longest wait between two tries, in seconds.", minimum=0)
    timeout: float = setting_from(
        lambda: hub_timeout(constants.HF_HUB_ETAG_TIMEOUT),
        "Seconds a metadata call may take.",
        kind=float,
        above=0,
    )

    def __post_init__(self) -> None:
        validate(self)

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

    def model_info(self, *args, timeout: float | None = None, **kwargs):
        return super().model_info(*args, timeout=self._timeout if timeout is None else timeout, **kwargs)


#: How a host name that does not resolve reads (glibc, musl, macOS): the endpoint is wrong or there is no network,
#: which waiting does not change.
_UNRESOLVED = (
    "Name or service not known",
    "Temporary failure in name resolution",
    "nodename nor servname",
    "No address associated",
)


def unresolved(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a host name that does not resolve."""
    return any(
        isinstance(e, OSError | httpx2.ConnectError) and any(t in str(e) for t in _UNRESOLVED) for e in chain(exc)
    )


def transient(exc: BaseException) -> bool:
    """Whether retrying may help: rate limits, server errors, timeouts, dropped or short transfers (not a host name
    that does not resolve, nor a Hub that refuses connections: those fail at once)."""
    if unresolved(exc) or any(isinstance(e, HubRefused) for e in chain(exc)):
        return False
    for e in chain(exc):
        if isinstance(e, OfflineModeIsEnabled):
            return False
        if isinstance(e, HfHubHTTPError) and e.response is not None:
            return e.response.status_code in RETRY_STATUS
        if isinstance(e, (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError, CorruptDownload)):
            return True
        if isinstance(e, OSError) and "Consistency check failed" in str(e):
            return True
    return False


#: What a call says once the Hub has refused a connection twice in a row: a run stops asking it (see :func:`refused`).
HUB_REFUSED = "the Hub refuses connections"
_DOWN: dict[str, str] = {}  # endpoint -> the line said of it, once its connections were refused
_DOWN_LOCK = threading.Lock()


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection the Hub's host refused (no server listening: down, or the wrong port)."""
    return any(
        isinstance(e, ConnectionRefusedError) or (isinstance(e, httpx2.ConnectError) and "refused" in str(e).lower())
        for e in chain(exc)
    )


def _endpoint(hub_settings: HubSettings) -> str:
    return (hub_settings.endpoint or constants.ENDPOINT).rstrip("/")


def hub_down(hub_settings: HubSettings) -> str | None:
    """The line said of the settings' endpoint if it refused connections in this process, else None."""
    with _DOWN_LOCK:
        return _DOWN.get(_endpoint(hub_settings))


def _refuse(hub_settings: HubSettings) -> HubRefused:
    endpoint = _endpoint(hub_settings)
    host = endpoint.split("://", 1)[-1].split("/", 1)[0]
    with _DOWN_LOCK:
        line = _DOWN.setdefault(endpoint, f"{HUB_REFUSED} at {host} (refused twice: down, or HF_ENDPOINT wrong)")
    return HubRefused(line)


def _retry_after(exc: BaseException) -> float | None:
    for e in chain(exc):
        if isinstance(e, HfHubHTTPError) and e.response is not None:
            value = e.response.headers.get("Retry-After")
            try:
                return float(value) if value is not None else None
            except ValueError:
                return None
    return None


def with_retries(
    call: Callable[[], T], hub_settings: HubSettings, what: str, sleep: Callable[[float], None] = time.sleep
) -> T:
    """``call()``, retried on transient failures with exponential backoff and jitter.

    ``Retry-After`` is honoured (capped at ``max_wait``). After the last try the error is raised, with
    the number of tries it came after in its ``modelvec_tries`` attribute (for :func:`describe_error`).
    """
    guard_hub_client()
    wait = hub_settings.backoff
    if hub_down(hub_settings) is not None:
        raise _refuse(hub_settings)
    for attempt in range(hub_settings.retries + 1):
        try:
            return call()
        except Exception as exc:
            if refused(exc):  # nothing listens: asked once more after a moment (a restart), then said once a run
                if attempt == 0:
                    sleep(min(hub_settings.backoff, 1.0))
                    continue
                raise _refuse(hub_settings) from exc
            if attempt >= hub_settings.retries or not transient(exc):
                try:
                    exc.modelvec_tries = attempt + 1  # type: ignore[attr-defined]
                except AttributeError:  # pragma: no cover - exceptions with __slots__
                    pass
                raise
            pause = _retry_after(exc)
            pause = min(hub_settings.max_wait, pause if pause is not None else wait * (1 + 0.25 * random.random()))
            sleep(pause)
            wait = min(hub_settings.max_wait, wait * 2)
    raise AssertionError("unreachable")  # pragma: no cover


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else ""


def describe_error(exc: BaseException) -> str:
    """The cause of a failed Hub call in one line, with how many tries it took, for the failures table."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    counts = (getattr(e, "modelvec_tries", None) for e in chain(exc))
    tries = next((n for n in counts if isinstance(n, int)), 1)
    after = f" after {tries} tries" if tries > 1 else ""
    for e in chain(exc):
        if isinstance(e, HubRefused):
            return str(e)
        if isinstance(e, GatedRepoError):
            return "gated repository: request access on the Hub and log in (hf auth login or HF_TOKEN)"
        if isinstance(e, RepositoryNotFoundError):
            return "repository not found (or private without a token)"
        if isinstance(e, RevisionNotFoundError):
            return "revision not found"
        if isinstance(e, RemoteEntryNotFoundError):
            return "file not found in the repository"
        if isinstance(e, OfflineModeIsEnabled) or (
            isinstance(e, LocalEntryNotFoundError) and constants.is_offline_mode()
        ):
            return "offline (HF_HUB_OFFLINE=1) and not in the local cache"
        if isinstance(e, HfHubHTTPError) and e.response is not None:
            return f"HTTP {e.response.status_code} from the Hub{after}"
        if isinstance(e, UnsafeHubName):
            return f"unsafe name from the Hub: {_first_line(e)}"
        if isinstance(e, HFValidationError):
            return f"invalid repository id or revision: {_first_line(e)}"
        if isinstance(e, httpx2.TimeoutException):
            return f"timed out{after} ({type(e).__name__})"
        if isinstance(e, httpx2.NetworkError) and unresolved(e):
            host = constants.ENDPOINT.split("://", 1)[-1].split("/", 1)[0]
            return f"the Hub cannot be reached: its host name does not resolve (no network? HF_ENDPOINT: {host})"
        if isinstance(e, httpx2.NetworkError):
            return f"connection failed{after} ({type(e).__name__}: {_first_line(e)})".replace(": )", ")")
        if isinstance(e, httpx2.RemoteProtocolError):
            return f"connection dropped mid-answer{after} ({_first_line(e)})"
        if isinstance(e, CorruptDownload):
            return f"downloaded bytes do not match their sha256{after}: {_first_line(e)}"
        if isinstance(e, OSError) and "Consistency check failed" in str(e):
            return f"download of the wrong size{after}: {_first_line(e)}"
    return f"{type(exc).__name__}: {_first_line(exc)}".rstrip(": ")


def _explain(exc: BaseException) -> tuple[Kind, str] | None:
    """For :func:`modelvec.core.errors.error_of`: a failed Hub call is the world's failure, said in one line."""
    hub_error = (HfHubHTTPError, OfflineModeIsEnabled, UnsafeHubName, CorruptDownload, httpx2.HTTPError, HubRefused)
    if any(isinstance(e, hub_error) for e in chain(exc)):
        return Kind.TRANSIENT, describe_error(exc)
    return None


register_explainer(_explain)
