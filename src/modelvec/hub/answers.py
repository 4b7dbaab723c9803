"""One request for a byte range of a Hub file, and the checks on its answer.

Everything goes through huggingface_hub's public API (``hf_hub_url``, ``build_hf_headers``, ``get_session``,
``hf_raise_for_status``), so ``HF_ENDPOINT``, tokens, ``HF_HUB_OFFLINE`` and a client factory set by the user
(proxies, certificates) mean what they mean to any Hub user, as ``HfApi.get_safetensors_metadata`` reads its
headers. Nothing in an answer is trusted: each must be a 206 whose ``Content-Range`` is the range asked for, of a
file of the size the header fetch learnt, with a body of exactly that length; anything else is a
:class:`~modelvec.core.errors.BadRangeAnswer`, which the callers (:mod:`.remote_header`, :mod:`.ranges`) retry.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from huggingface_hub import get_session, hf_hub_url
from huggingface_hub.errors import OfflineModeIsEnabled
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

from ..core.errors import BadRangeAnswer, FetchError, shown
from .client import HubSettings, describe_error
from .http import httpx2

#: An error answer's body is read (for huggingface_hub's message) only if it announces at most this many bytes.
_ERROR_BODY_LIMIT = 1 << 20
_CONTENT_RANGE = re.compile(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*", re.IGNORECASE)


@dataclass(frozen=True)
class RemoteFile:
    """One file of a Hub repository that is read by ranges; ``size`` is its length in bytes, from the header
    fetch's ``Content-Range`` total (every range answer must name the same total). ``revision`` should be a commit
    sha, so that every range comes from the same bytes."""

    repo_id: str
    revision: str
    filename: str
    size: int


def refuse_offline(repo_id: str, filename: str, hub_settings: HubSettings) -> None:
    if hub_settings.offline:
        raise FetchError(
            repo_id, f"{shown(filename)}: offline (HF_HUB_OFFLINE=1): byte ranges of a Hub file cannot be read"
        ) from OfflineModeIsEnabled("HF_HUB_OFFLINE=1")


def url_of(file: RemoteFile, hub_settings: HubSettings) -> str:
    return hf_hub_url(file.repo_id, file.filename, revision=file.revision, endpoint=hub_settings.endpoint)


def range_headers(hub_settings: HubSettings, start: int, stop: int) -> dict[str, str]:
    """The Hub's headers (token, user agent), one range ``[start, stop)``, and no compression (a range is of the
    file's own bytes)."""
    return {
        **build_hf_headers(token=hub_settings.token),
        "Accept-Encoding": "identity",
        "Range": f"bytes={start}-{stop - 1}",
    }


@contextmanager
def stream_get(url: str, headers: dict[str, str], hub_settings: HubSettings) -> Iterator[httpx2.Response]:
    """A streamed GET through huggingface_hub's shared client (redirects followed, as to the Hub's CDN); an error
    status raises huggingface_hub's own error (its body is read for the message only when it is small)."""
    with get_session().stream(
        "GET", url, headers=headers, timeout=hub_settings.timeout, follow_redirects=True
    ) as response:
        if response.status_code >= 400:
            try:
                small = int(response.headers.get("Content-Length", "")) <= _ERROR_BODY_LIMIT
            except ValueError:
                small = False
            if small:
                response.read()
            else:
                response.close()  # huggingface_hub then gives its message without the body
            hf_raise_for_status(response)
        if response.status_code not in (200, 206):
            raise BadRangeAnswer(f"HTTP {response.status_code} to a range request")
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise BadRangeAnswer(f"the answer is encoded ({shown(encoding, 40)}), not the file's own bytes")
        yield response


def content_range(response: httpx2.Response) -> tuple[int, int, int | None]:
    """``[first, last]`` and the total of a 206's ``Content-Range`` (total None when ``*``)."""
    value = response.headers.get("Content-Range")
    m = _CONTENT_RANGE.fullmatch(value or "")
    if m is None:
        raise BadRangeAnswer(f"a 206 answer with Content-Range {shown(value, 60)}")
    first, last, total = m.groups()
    return int(first), int(last), None if total == "*" else int(total)


def content_length(response: httpx2.Response) -> int | None:
    try:
        return int(response.headers["Content-Length"])
    except (KeyError, ValueError):
        return None


def check_range(response: httpx2.Response, start: int, stop: int, size: int) -> None:
    """A 206 must say it carries exactly ``[start, stop)`` of a file of ``size`` bytes."""
    first, last, total = content_range(response)
    if (first, last + 1, total) != (start, stop, size):
        raise BadRangeAnswer(
            f"asked for bytes {start}-{stop - 1} of {size}, the answer says it has bytes {first}-{last} of "
            f"{'an unknown size' if total is None else total}"
        )
    length = content_length(response)
    if length is not None and length != stop - start:
        raise BadRangeAnswer(f"asked for {stop - start} bytes, the answer announces {length}")


def read_until(response: httpx2.Response, need: Callable[[bytearray], int]) -> bytes:
    """Read a body until ``need(read so far)`` bytes are there (or it ends); the bytes read, possibly more."""
    buffer = bytearray()
    for chunk in response.iter_raw():
        buffer += chunk
        if len(buffer) >= need(buffer):
            break
    return bytes(buffer)


def cause_of(exc: BaseException) -> str:
    """One line: why a request failed, and after how many tries."""
    if isinstance(exc, BadRangeAnswer):
        tries = getattr(exc, "modelvec_tries", 1)
        return f"bad answer to a range request{f' after {tries} tries' if tries > 1 else ''}: {shown(str(exc), 160)}"
    return describe_error(exc)
