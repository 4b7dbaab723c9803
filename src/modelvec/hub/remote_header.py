"""The header of a safetensors or GGUF file on the Hub, read by range requests without downloading the file.

:func:`fetch_safetensors_header` reads its first 128 KiB (:data:`HEADER_PROBE`), and the rest of the header if it is
longer, and learns the file's size from the answer (:mod:`.answers` checks each). A server that ignores ``Range`` is
read only as far as the header goes, then hung up on. A header that is no sound safetensors header (checked by the
parser a local file's header goes through, :mod:`modelvec.core.safetensors`) is the file's fault: a
:class:`~modelvec.core.errors.CheckpointError`. A GGUF's header (:func:`fetch_gguf_header`) is read the same way, as far
as its metadata and tensor table go (:mod:`modelvec.core.gguf`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from huggingface_hub import hf_hub_url
from huggingface_hub.errors import HfHubHTTPError

from ..core.errors import BadRangeAnswer, CheckpointError, FetchError, ModelvecError, raise_if_resource, shown
from ..core.gguf import GGUFFault, NeedMore, header_extent
from ..core.safetensors import MAX_HEADER, HeaderFault, data_start, header_length, parse_header
from .answers import (
    RemoteFile,
    cause_of,
    check_range,
    content_length,
    content_range,
    range_headers,
    read_until,
    refuse_offline,
    stream_get,
)
from .client import HubSettings, with_retries
from .names import check_repo_id, check_revision

#: Bytes asked for by the first request of a header: most safetensors headers are far smaller (a shard of an 8B
#: Llama: ~30 KB), so one request; and small beside what a small model's share of rows costs (3 shards of SmolLM2
#: at 1 MiB each were 1.4 % of its matrices' bytes).
HEADER_PROBE = 1 << 17
_Header = TypeVar("_Header")
_UNSATISFIED = re.compile(r"\s*bytes\s+\*/(\d+)\s*", re.IGNORECASE)


@dataclass(frozen=True)
class SafetensorsHeader:
    """The header of a remote safetensors file: ``raw`` is its first ``data_start`` bytes verbatim (the 8-byte length
    prefix and the JSON header, to write at offset 0 of the local file), ``header`` the parsed JSON (tensor name ->
    {dtype, shape, data_offsets}, and ``__metadata__`` if any); a tensor's bytes are at ``data_start + offset``."""

    file: RemoteFile
    raw: bytes
    header: dict[str, Any]
    data_start: int


def _header_need(buffer: bytearray | bytes) -> int:
    """How many bytes from the start of a safetensors file hold its header: 8, then 8 + the length they give
    (only 8 when that length is over safetensors' limit: refused, never read)."""
    if len(buffer) < 8:
        return 8
    length = header_length(buffer)
    return 8 if length > MAX_HEADER else 8 + length


def _safetensors_need(buffer: bytes | bytearray, size: int) -> int:
    return min(_header_need(buffer), size)


def _read_first(
    url: str,
    hub_settings: HubSettings,
    need: Callable[[bytearray | bytes, int], int] = _safetensors_need,
    probe: int = HEADER_PROBE,
) -> tuple[bytes, int]:
    """The first bytes of the file (its first ``probe`` bytes, or as far as ``need`` says its header goes if the
    server sends the whole file) and the file's size."""
    try:
        return _read_first_answer(url, hub_settings, need, probe)
    except HfHubHTTPError as exc:  # 416 to bytes=0-...: the file is empty; its size is in Content-Range
        m = _UNSATISFIED.fullmatch(exc.response.headers.get("Content-Range") or "")
        if exc.response.status_code == 416 and m is not None and int(m.group(1)) == 0:
            return b"", 0
        raise


def _read_first_answer(
    url: str, hub_settings: HubSettings, need: Callable[[bytearray | bytes, int], int], probe: int
) -> tuple[bytes, int]:
    with stream_get(url, range_headers(hub_settings, 0, probe), hub_settings) as response:
        if response.status_code == 200:  # Range ignored: read what the header needs and hang up
            announced = content_length(response)
            if announced is None:
                raise BadRangeAnswer("the server ignored Range and did not say the file's size")
            size: int = announced
            data = read_until(response, lambda got: need(got, size))
            if len(data) < need(data, size):
                raise BadRangeAnswer(f"the answer ended after {len(data)} of the file's {size} bytes")
            return data, size
        first, last, total = content_range(response)
        if total is None or first != 0 or not (last == min(probe, total) - 1):
            raise BadRangeAnswer(
                f"asked for bytes 0-{probe - 1}, the answer says it has bytes {first}-{last} of {total}"
            )
        data = read_until(response, lambda _: last + 1)
        if len(data) != last + 1:
            raise BadRangeAnswer(f"asked for {last + 1} bytes, the answer has {len(data)}")
        return data, total


def _read_span(url: str, hub_settings: HubSettings, start: int, stop: int, size: int) -> bytes:
    """Bytes ``[start, stop)`` of a file of ``size`` bytes, in memory (for a header: at most 100 MB)."""
    with stream_get(url, range_headers(hub_settings, start, stop), hub_settings) as response:
        if response.status_code == 200:
            if content_length(response) not in (None, size):
                raise BadRangeAnswer(f"the whole file announced {content_length(response)} bytes, not {size}")
            data = read_until(response, lambda _: stop)[start:stop]
        else:
            check_range(response, start, stop, size)
            data = read_until(response, lambda _: stop - start + 1)  # one more byte would be one too many
        if len(data) != stop - start:
            raise BadRangeAnswer(f"asked for bytes {start}-{stop - 1}, the answer has {len(data)} bytes")
        return data


def fetch_safetensors_header(
    repo_id: str, revision: str, filename: str, hub_settings: HubSettings
) -> SafetensorsHeader:
    """The header of a safetensors file on the Hub and the file's size, without downloading the file.

    One request for the first 128 KiB (and, for a longer header, one for the rest), each retried as the settings say;
    a server that ignores ``Range`` is read only as far as the header goes, then hung up on. A header that safetensors
    would refuse (over its 100 MB limit, not a JSON object of sound tensor entries, tensors that do not tile the file's
    data exactly) is a :class:`CheckpointError` (the file is bad), said in the words a local file's fault is said in
    (one parser: :func:`~modelvec.core.safetensors.parse_header`); failing to reach it is a :class:`FetchError`.
    """

    def read(url: str, what: str) -> SafetensorsHeader:
        data, total = with_retries(lambda: _read_first(url, hub_settings), hub_settings, what)
        start = data_start(data, total)
        if len(data) < start:
            got = len(data)
            rest = with_retries(lambda: _read_span(url, hub_settings, got, start, total), hub_settings, what)
            data += rest
        raw = data[:start]
        header = parse_header(raw[8:], total - start)
        return SafetensorsHeader(RemoteFile(repo_id, revision, filename, total), raw, header, start)

    return _fetched(repo_id, revision, filename, hub_settings, HeaderFault, read)


def _fetched(
    repo_id: str,
    revision: str,
    filename: str,
    hub_settings: HubSettings,
    fault: type[Exception],
    read: Callable[[str, str], _Header],
) -> _Header:
    """``read(url, what)`` of a Hub file's header, its names checked first: the file's ``fault`` (its header is
    unsound) as a :class:`CheckpointError`, in the words a local file's would be said in; anything else that stops
    it as a one-line :class:`FetchError` (the machine's own, as a resource error)."""
    check_repo_id(repo_id)
    check_revision(repo_id, revision)
    refuse_offline(repo_id, filename, hub_settings)
    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=hub_settings.endpoint)
    try:
        return read(url, f"{repo_id}/{filename}")
    except fault as exc:
        raise CheckpointError(repo_id, f"{shown(filename)}: {exc}") from None
    except ModelvecError:
        raise
    except Exception as exc:
        raise_if_resource(exc, repo_id)
        raise FetchError(repo_id, f"{shown(filename)}: could not read its header: {cause_of(exc)}") from exc


#: Bytes asked for by the first request of a GGUF's header; its metadata holds the tokenizer (a 49k-token
#: vocabulary: 1.8 MB), so a longer one takes one more request for what the first says is left (its vocabulary at
#: the mean token length read), and more only where that was short (each asking for twice as much).
GGUF_PROBE = 1 << 18
#: The longest GGUF header read (a 256k-token vocabulary with its merges is under 20 MB).
GGUF_MAX_HEADER = 1 << 28


@dataclass(frozen=True)
class GGUFHeader:
    """The header of a remote GGUF file: ``raw`` is the file's first bytes verbatim as fetched (its metadata, tensor
    table and the padding before the data at ``data_start``, and whatever data the last request brought: what to
    write at offset 0 of the local file, held from then on)."""

    file: RemoteFile
    raw: bytes
    data_start: int


def _gguf_need(buffer: bytes | bytearray, size: int) -> int:
    try:
        return header_extent(buffer, size).data_start
    except NeedMore as more:
        return min(more.size, size)
    except GGUFFault:
        return len(buffer)  # enough: the fault is said once the bytes are in


def fetch_gguf_header(repo_id: str, revision: str, filename: str, hub_settings: HubSettings) -> GGUFHeader:
    """The header of a GGUF file on the Hub and the file's size, without downloading the file: its first 256 KiB,
    then what the header says is left (its vocabulary at the mean token length read, :data:`GGUF_PROBE`; else twice
    as much), each request retried as the settings say. A header that is no sound GGUF header (:func:`~modelvec.core.gguf.header_extent`: a bad magic, a tensor table that puts a tensor
    beyond the file, a file that ends in its header) is a :class:`CheckpointError`; failing to reach it is a
    :class:`FetchError`."""

    def read(url: str, what: str) -> GGUFHeader:
        data, total = with_retries(lambda: _read_first(url, hub_settings, _gguf_need, GGUF_PROBE), hub_settings, what)
        while True:
            try:
                start = header_extent(data, total).data_start
                break
            except NeedMore as more:
                if more.size > min(total, GGUF_MAX_HEADER):
                    raise GGUFFault(
                        f"truncated: the file ({total:,} bytes) ends inside its header"
                        if more.size > total
                        else f"a header of over {GGUF_MAX_HEADER:,} bytes"
                    ) from None
                got = len(data)  # what the header says is left, else twice as much
                upto = min(total, more.estimate if more.estimate > more.size else max(more.size, 2 * got))
                data += with_retries(partial(_read_span, url, hub_settings, got, upto, total), hub_settings, what)
        return GGUFHeader(RemoteFile(repo_id, revision, filename, total), bytes(data), start)

    return _fetched(repo_id, revision, filename, hub_settings, GGUFFault, read)
