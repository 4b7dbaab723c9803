"""Range reads of Hub files (modelvec.hub.ranges) through the real huggingface_hub client against a local Hub.

What is checked is what the Hub saw (the ranges asked for, the bytes it sent) and the bytes that landed in the local
file, under the faults the local Hub can inject: answers of another range, whole files for a range, short bodies,
dropped connections.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import constants as hf_constants
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save

from modelvec.core.errors import CheckpointError, FetchError, Kind, error_of
from modelvec.core.spans import merge, missing
from modelvec.hub.answers import RemoteFile
from modelvec.hub.client import HubSettings
from modelvec.hub.ranges import coalesce_ranges, fetch_ranges, gap_worth
from modelvec.hub.remote_header import HEADER_PROBE, fetch_safetensors_header
from modelvec.testing.localhub import LocalHub

REPO = "org/weights"
FILE = "model.safetensors"


def raw_safetensors(header: dict, data: bytes) -> bytes:
    """A safetensors file as bytes, from a header given as is (so it may lie)."""
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data


@pytest.fixture()
def hub(tmp_path):
    return LocalHub(tmp_path / "hub")


@pytest.fixture()
def server(hub):
    with hub.serve() as srv:
        yield srv
    hub.clear_faults()


@pytest.fixture()
def hub_settings(server, tmp_path):
    return HubSettings(
        endpoint=server.endpoint, cache_dir=str(tmp_path / "cache"), token=False, retries=2, backoff=0.01
    )


@pytest.fixture()
def weights(hub):
    """A real safetensors file of about 1.3 MB on the Hub: (its bytes, the commit sha)."""
    rng = np.random.default_rng(0)
    tensors = {f"layer.{i}.weight": rng.standard_normal((64, 1024)).astype(np.float32) for i in range(5)}
    data = save(tensors, metadata={"format": "pt"})
    return data, hub.publish(REPO, {FILE: data, "config.json": b"{}"})


def gets(server, start: int = 0) -> list[tuple[str | None, int | None]]:
    return [(r["range"], r["status"]) for r in server.requests[start:] if r["method"] == "GET"]


def remote(data: bytes, sha: str) -> RemoteFile:
    return RemoteFile(REPO, sha, FILE, len(data))


# --- the header --------------------------------------------------------------------------------------------------


def test_the_head_is_the_files_first_bytes_and_its_parsed_header(server, hub_settings, weights):
    data, sha = weights
    head = fetch_safetensors_header(REPO, sha, FILE, hub_settings)
    length = int.from_bytes(data[:8], "little")
    assert head.file == RemoteFile(REPO, sha, FILE, len(data))
    assert head.raw == data[: 8 + length] and head.data_start == 8 + length
    assert head.header == json.loads(data[8 : 8 + length])
    assert head.header["__metadata__"] == {"format": "pt"}
    assert head.header["layer.4.weight"]["shape"] == [64, 1024]
    assert gets(server) == [(f"bytes=0-{HEADER_PROBE - 1}", 206)]
    assert server.bytes_sent() == HEADER_PROBE


def test_a_header_longer_than_the_first_request_takes_a_second(hub, server, hub_settings):
    header = {"__metadata__": {"pad": "x" * 1_500_000}, "t": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]}}
    data = raw_safetensors(header, bytes(range(16)))
    sha = hub.publish(REPO, {FILE: data})
    head = fetch_safetensors_header(REPO, sha, FILE, hub_settings)
    assert head.raw == data[:-16] and head.header == header and head.file.size == len(data)
    assert gets(server) == [(f"bytes=0-{HEADER_PROBE - 1}", 206), (f"bytes={HEADER_PROBE}-{len(data) - 17}", 206)]
    assert server.bytes_sent() == len(data) - 16


def test_a_small_file_head_and_a_server_ignoring_range(hub, server, hub_settings):
    header = {"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    data = raw_safetensors(header, b"\0" * 8)
    sha = hub.publish(REPO, {FILE: data})
    assert fetch_safetensors_header(REPO, sha, FILE, hub_settings).file.size == len(
        data
    )  # 206 of the whole (small) file
    hub.fail(f"*/{FILE}", kind="ignore-range", times=1)
    head = fetch_safetensors_header(REPO, sha, FILE, hub_settings)
    assert (head.raw, head.header, head.file.size) == (data[:-8], header, len(data))  # size from Content-Length
    assert gets(server)[-1] == (f"bytes=0-{HEADER_PROBE - 1}", 200)


def test_a_server_ignoring_range_is_hung_up_on_once_the_header_is_read(tmp_path):
    hub = LocalHub(tmp_path / "hub")
    header = {"t": {"dtype": "U8", "shape": [16_000_000], "data_offsets": [0, 16_000_000]}}
    data = raw_safetensors(header, os.urandom(16_000_000))
    sha = hub.publish(REPO, {FILE: data})
    with hub.serve(bandwidth="10MB") as server:  # the whole file would take 1.6 s
        hub_settings = HubSettings(endpoint=server.endpoint, token=False, retries=0, backoff=0.01)
        hub.fail(f"*/{FILE}", kind="ignore-range", times=1)
        head = fetch_safetensors_header(REPO, sha, FILE, hub_settings)
        assert head.header == header and head.file.size == len(data)
        time.sleep(0.3)  # the server notices the closed connection at its next write
        assert server.requests[-1]["status"] == 200 and server.requests[-1]["bytes"] < len(data) // 2


@pytest.mark.parametrize(
    "data, cause",
    [
        (
            raw_safetensors({"t": {"dtype": "U8", "shape": [1000], "data_offsets": [0, 1000]}}, b"x" * 10),
            "model.safetensors: truncated (its header claims 1,000 bytes of tensors, the file has 10)",
        ),
        (b"\x10\0\0\0\0\0\0\0{not json at all", "model.safetensors: header is not valid JSON"),
        (b"\x04\0\0\0\0\0\0\0[42]", "model.safetensors: header is not a JSON object"),
        ((200_000_000).to_bytes(8, "little") + b"{}", "over safetensors' 100 MB limit"),
        ((500).to_bytes(8, "little") + b"{}", "truncated (its header claims 500 bytes, 2 follow)"),
        (b"\x01\0", "truncated (2 bytes"),
        (b"", "truncated (0 bytes"),
    ],
    ids=["claims-more-than-the-file", "bad-json", "not-an-object", "huge-length", "short-header", "tiny", "empty"],
)
def test_a_bad_header_is_the_files_fault(hub, server, hub_settings, data, cause):
    sha = hub.publish(REPO, {FILE: data})
    with pytest.raises(CheckpointError) as err:
        fetch_safetensors_header(REPO, sha, FILE, hub_settings)
    assert cause in str(err.value) and str(err.value).startswith(f"{REPO}: ")
    assert error_of(err.value, REPO).kind is Kind.CONTENT and "\n" not in str(err.value)
    assert len(gets(server)) == 1  # nothing retried: the file is bad, not the link


T = {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}
MALFORMED = {
    "claims-more-than-the-file": raw_safetensors({"t": {**T, "shape": [1000], "data_offsets": [0, 1000]}}, bytes(10)),
    "bad-json": b"\x10\0\0\0\0\0\0\0{not json at all",
    "not-utf8": b'\x08\0\0\0\0\0\0\0{"\xff": 1}',
    "not-an-object": b"\x04\0\0\0\0\0\0\0[42]",
    "entry-not-an-object": raw_safetensors({"t": 5}, b""),
    "unknown-dtype": raw_safetensors({"t": {**T, "dtype": "F33"}}, bytes(8)),
    "shape-disagrees-with-bytes": raw_safetensors({"t": {**T, "shape": [3]}}, bytes(8)),
    "overlap": raw_safetensors({"t": T, "u": {**T, "data_offsets": [4, 12]}}, bytes(12)),
    "gap": raw_safetensors({"t": {**T, "data_offsets": [4, 12]}}, bytes(12)),
    "trailing-bytes": raw_safetensors({"t": T}, bytes(24)),
    "metadata-not-strings": raw_safetensors({"__metadata__": {"format": 1}, "t": T}, bytes(8)),
    "huge-length": (200_000_000).to_bytes(8, "little") + b"{}",
    "short-header": (500).to_bytes(8, "little") + b"{}",
    "tiny": b"\x01\0",
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_hub_file_and_a_local_file_are_refused_alike(hub, server, hub_settings, tmp_path, case):
    """One parser and one set of checks: a malformed header is refused in the same words, as the file's fault
    (content), whether its bytes come by a range request or from a local file."""
    from modelvec import Checkpoint

    data = MALFORMED[case]
    sha = hub.publish(REPO, {FILE: data})
    with pytest.raises(CheckpointError) as remote:
        fetch_safetensors_header(REPO, sha, FILE, hub_settings)
    local = tmp_path / FILE
    local.write_bytes(data)
    with pytest.raises(CheckpointError) as here:
        Checkpoint(local, name=REPO).keys()
    said_remote = str(remote.value).removeprefix(f"{REPO}: {FILE}: ")
    said_here = str(here.value).removeprefix(f"{REPO}: cannot read {FILE}: ")
    assert said_remote == said_here and said_remote != str(remote.value) and said_here != str(here.value)
    assert error_of(remote.value, REPO).kind is error_of(here.value, REPO).kind is Kind.CONTENT


def test_a_missing_file_fails_at_once_in_one_line(hub, server, hub_settings, weights):
    _, sha = weights
    with pytest.raises(FetchError, match=r"^org/weights: nope\.safetensors: .*file not found") as err:
        fetch_safetensors_header(REPO, sha, "nope.safetensors", hub_settings)
    assert error_of(err.value, REPO).kind is Kind.TRANSIENT and len(gets(server)) == 1


# --- ranges ------------------------------------------------------------------------------------------------------


def test_coalescing():
    assert coalesce_ranges([(300, 400), (100, 200), (5, 5), (150, 250), (1000, 1100)], gap=100) == [
        (100, 400),
        (1000, 1100),
    ]
    assert coalesce_ranges([(0, 10), (11, 20)], gap=0) == [(0, 10), (11, 20)]
    assert coalesce_ranges([(0, 10), (10, 20)], gap=0) == [(0, 20)]
    # a gap longer than a range beside it is not fetched, however small: narrow rows stay a share of the bytes
    assert coalesce_ranges([(0, 10), (50, 60), (65, 200)], gap=100) == [(0, 10), (50, 200)]
    rng = np.random.default_rng(0)
    for _ in range(200):
        starts = np.sort(rng.choice(100_000, size=30, replace=False))
        asked = [(int(a), int(a + rng.integers(1, 2_000))) for a in starts]
        got = coalesce_ranges(asked, gap=64 << 10)
        held = sum(b - a for a, b in merge(asked))
        assert sum(b - a for a, b in got) <= 2 * held  # within twice what was asked for
        assert not missing(asked, got)  # and all of it


wanted_ranges = st.lists(
    st.tuples(st.integers(0, 5_000), st.integers(0, 300)).map(lambda t: (t[0], t[0] + t[1])), max_size=40
)


@settings(max_examples=300, deadline=None)
@given(wanted=wanted_ranges, gap=st.integers(0, 2_000), cap=st.one_of(st.none(), st.integers(1, 3_000)))
def test_coalescing_fetches_every_wanted_byte_once_and_its_answers_slice_back_to_them(wanted, gap, cap):
    """Against the plan (the ranges wanted, overlapping or empty as they come): the requests are disjoint (no byte
    fetched twice), cover every wanted byte, each touches a wanted byte, none is over the cap, and all of them
    fetch at most twice the wanted bytes; the answers, sliced at the wanted ranges, are exactly the wanted bytes."""
    requests = coalesce_ranges(wanted, gap, cap)
    data = np.random.default_rng(len(wanted)).integers(0, 256, 5_400, dtype=np.uint8).tobytes()
    answers = {(a, b): data[a:b] for a, b in requests}  # what a server sends for each request
    assert all(a < b for a, b in requests)
    assert all(b <= c for (_, b), (c, _) in itertools.pairwise(requests))  # sorted and disjoint
    assert not missing(wanted, requests)
    held = merge(wanted)
    assert all(any(a < y and x < b for x, y in held) for a, b in requests)  # no request of gap bytes alone
    assert cap is None or all(b - a <= cap for a, b in requests)
    assert sum(b - a for a, b in requests) <= 2 * sum(b - a for a, b in held)
    for start, stop in wanted:
        pieces = [answers[a, b][max(start, a) - a : min(stop, b) - a] for a, b in requests if a < stop and start < b]
        assert b"".join(pieces) == data[start:stop]


@settings(max_examples=300, deadline=None)
@given(
    wanted=wanted_ranges,
    gap=st.integers(0, 2_000),
    cap=st.one_of(st.none(), st.integers(1, 3_000)),
    extra=st.integers(-500, 3_000),
)
def test_a_ceiling_leaves_out_the_largest_gaps_until_the_requests_fit(wanted, gap, cap, extra):
    """Under a ceiling of bytes the requests still hold every wanted byte and stay within the ceiling where the
    wanted bytes do; the gaps left out are the largest ones, so no fetched gap is larger than one left out; a
    ceiling above what the rule fetches changes nothing."""
    held = merge(wanted)
    asked = sum(b - a for a, b in held)
    free = coalesce_ranges(wanted, gap, cap)
    got = coalesce_ranges(wanted, gap, cap, ceiling=asked + extra)
    assert not missing(wanted, got)
    assert sum(b - a for a, b in got) <= max(asked, asked + extra)
    assert cap is None or all(b - a <= cap for a, b in got)

    def gaps_in(requests):
        return {(y, x) for (_, y), (x, _) in itertools.pairwise(held) if not missing([(y, x)], requests)}

    kept, dropped = gaps_in(got), gaps_in(free) - gaps_in(got)
    assert kept <= gaps_in(free)
    assert not kept or not dropped or max(x - y for y, x in kept) <= min(x - y for y, x in dropped)
    if sum(b - a for a, b in free) <= asked + extra:
        assert got == free


def test_the_gap_worth_fetching_is_what_a_request_costs_over_a_busy_link():
    assert gap_worth(125e6, 0.02, 16) == 156_250  # 1 Gbit/s, 20 ms, 16 in flight
    assert gap_worth(1.25e9, 0.02, 16) == 10 * gap_worth(125e6, 0.02, 16)  # a faster link: longer gaps
    assert gap_worth(125e6, 0.02, 32) < gap_worth(125e6, 0.02, 16)  # more in flight: a request costs less
    with pytest.raises(ValueError):
        gap_worth(0, 0.02, 16)


def test_random_plans_land_every_wanted_byte_from_requests_that_never_overlap(server, hub_settings, weights, tmp_path):
    """The real fetch, for random plans, gaps and caps: the Hub is asked for disjoint ranges that hold every wanted
    byte and sends each byte once, and the local file holds the remote bytes at every wanted offset."""
    data, sha = weights
    rng = np.random.default_rng(7)
    for case in range(12):
        starts = rng.integers(0, len(data) - 20_000, size=int(rng.integers(1, 25)))
        wanted = [(int(a), int(a + rng.integers(0, 20_000))) for a in starts]
        gap, cap = int(rng.integers(0, 50_000)), [None, int(rng.integers(1_000, 60_000))][case % 2]
        first, before = len(server.requests), server.bytes_sent()
        out = tmp_path / f"local-{case}"
        fetch_ranges(remote(data, sha), wanted, out, hub_settings, gap=gap, cap=cap, max_in_flight=4)
        asked = sorted(
            (int(a), int(b) + 1)
            for r, _ in gets(server, first)
            for a, b in [(r or "").removeprefix("bytes=").split("-")]
        )
        assert all(b <= c for (_, b), (c, _) in itertools.pairwise(asked)), "a byte asked for twice"
        assert not missing(wanted, asked)
        assert server.bytes_sent() - before == sum(b - a for a, b in asked)
        local = out.read_bytes()
        assert all(local[a:b] == data[a:b] for a, b in wanted)


def test_ranges_land_at_their_offsets_and_the_hub_sees_the_coalesced_ranges(server, hub_settings, weights, tmp_path):
    data, sha = weights
    out = tmp_path / "local.safetensors"
    ranges = [(900_000, 950_000), (100, 200), (300, 400), (5_000, 6_000), (1_200_000, len(data))]
    stats = fetch_ranges(remote(data, sha), ranges, out, hub_settings, gap=1_000)
    local = out.read_bytes()
    assert len(local) == len(data)  # created and sized to the remote file
    for start, stop in ranges:
        assert local[start:stop] == data[start:stop]
    assert local[:100] == bytes(100) and local[400:5_000] == bytes(4_600)  # the holes stay zero
    assert local[6_000:900_000] == bytes(894_000)
    expected = [(100, 400), (5_000, 6_000), (900_000, 950_000), (1_200_000, len(data))]
    assert sorted(gets(server), key=lambda g: int(g[0].split("=")[1].split("-")[0])) == [
        (f"bytes={a}-{b - 1}", 206) for a, b in expected
    ]
    total = sum(b - a for a, b in expected)
    assert server.bytes_sent() == total
    assert (stats.requests, stats.bytes, stats.whole_file) == (4, total, False) and stats.seconds > 0


def test_an_existing_local_file_keeps_its_other_bytes(server, hub_settings, weights, tmp_path):
    data, sha = weights
    out = tmp_path / "local.safetensors"
    out.write_bytes(b"\xaa" * len(data))
    fetch_ranges(remote(data, sha), [(10, 20)], out, hub_settings)
    local = out.read_bytes()
    assert local[10:20] == data[10:20] and local[:10] == b"\xaa" * 10 and local[20:] == b"\xaa" * (len(data) - 20)
    assert fetch_ranges(remote(data, sha), [], out, hub_settings).requests == 0


def test_requests_are_in_flight_together(hub, server, hub_settings, weights, tmp_path):
    data, sha = weights
    # the first request to arrive stalls; with two in flight, the other is answered meanwhile
    hub.fail(f"*/{FILE}", kind="slow", delay=0.6, times=1)
    fetch_ranges(remote(data, sha), [(0, 1_000), (500_000, 501_000)], tmp_path / "out", hub_settings, max_in_flight=2)
    answered = [(r["fault"], r["status"]) for r in server.requests if r["method"] == "GET"]
    assert answered == [(None, 206), ("slow", 206)]  # one at a time would log the stalled one first


@pytest.mark.parametrize("times", [1, None], ids=["once", "always"])
def test_a_server_ignoring_range_gives_the_whole_file_once(hub, server, hub_settings, weights, tmp_path, times):
    data, sha = weights
    hub.fail(f"*/{FILE}", kind="ignore-range", times=times)
    out = tmp_path / "out"
    ranges = [(0, 1_000), (300_000, 301_000), (600_000, 601_000), (900_000, 901_000)]
    stats = fetch_ranges(remote(data, sha), ranges, out, hub_settings, gap=0, max_in_flight=4)
    assert out.read_bytes() == data  # every byte at its offset
    assert stats.whole_file
    if times is None:  # every answer is the whole file: one is written, the others hung up on
        assert stats.bytes == len(data)
    assert any(status == 200 for _, status in gets(server))


def test_a_wrong_content_range_is_retried(hub, server, hub_settings, weights, tmp_path):
    data, sha = weights
    hub.fail(f"*/{FILE}", kind="bad-content-range", times=1)
    stats = fetch_ranges(remote(data, sha), [(1_000, 2_000)], tmp_path / "out", hub_settings)
    assert (tmp_path / "out").read_bytes()[1_000:2_000] == data[1_000:2_000]
    assert gets(server) == [("bytes=1000-1999", 206)] * 2 and stats.requests == 2 and stats.bytes == 1_000


def test_a_persistent_wrong_content_range_fails_in_one_transient_line(hub, server, hub_settings, weights, tmp_path):
    data, sha = weights
    hub.fail(f"*/{FILE}", kind="bad-content-range", times=None)
    with pytest.raises(FetchError) as err:
        fetch_ranges(remote(data, sha), [(1_000, 2_000)], tmp_path / "out", hub_settings)
    message = str(err.value)
    assert message.startswith(f"{REPO}: {FILE}: ") and "after 3 tries" in message and "\n" not in message
    assert "bytes 1000-1999" in message and "1001-2000" in message
    assert error_of(err.value, REPO).kind is Kind.TRANSIENT
    assert len(gets(server)) == hub_settings.retries + 1


@pytest.mark.parametrize("kind", ["short", "reset"])
def test_a_body_cut_short_is_resumed(hub, server, hub_settings, weights, tmp_path, kind):
    data, sha = weights
    hub.fail(f"*/{FILE}", kind=kind, after_bytes=100_000, times=1)
    stats = fetch_ranges(remote(data, sha), [(50_000, 450_000)], tmp_path / "out", hub_settings)
    assert (tmp_path / "out").read_bytes()[50_000:450_000] == data[50_000:450_000]
    (first, _), (second, status) = gets(server)
    resumed = int(second.split("=")[1].split("-")[0])
    assert first == "bytes=50000-449999" and status == 206 and second.endswith("-449999")
    assert resumed == 150_000 if kind == "short" else 50_000 <= resumed <= 150_000  # what arrived is kept
    assert stats.requests == 2 and stats.bytes == 400_000


def test_server_errors_are_retried_and_a_missing_file_is_not(hub, server, hub_settings, weights, tmp_path):
    data, sha = weights
    hub.fail(f"*/{FILE}", status=503, times=2)
    fetch_ranges(remote(data, sha), [(0, 10)], tmp_path / "out", hub_settings)
    assert [s for _, s in gets(server)] == [503, 503, 206]
    gone = RemoteFile(REPO, sha, "gone.safetensors", 100)
    with pytest.raises(FetchError, match="gone.safetensors: .*file not found"):
        fetch_ranges(gone, [(0, 10)], tmp_path / "out2", hub_settings)
    assert len(gets(server)) == 4


def test_ranges_outside_the_file_are_refused(hub_settings, weights, tmp_path):
    data, sha = weights
    with pytest.raises(ValueError, match="not inside"):
        fetch_ranges(remote(data, sha), [(0, len(data) + 1)], tmp_path / "out", hub_settings)


def test_offline_fails_at_once_without_a_request(server, hub_settings, weights, tmp_path, monkeypatch):
    data, sha = weights
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    before = len(server.requests)
    with pytest.raises(FetchError, match=r"offline \(HF_HUB_OFFLINE=1\)") as err:
        fetch_safetensors_header(REPO, sha, FILE, hub_settings)
    assert error_of(err.value, REPO).kind is Kind.TRANSIENT
    with pytest.raises(FetchError, match=r"^org/weights: model.safetensors: offline \(HF_HUB_OFFLINE=1\)"):
        fetch_ranges(remote(data, sha), [(0, 10)], tmp_path / "out", hub_settings)
    assert len(server.requests) == before and not Path(tmp_path / "out").exists()


def _open_and_fill(args: tuple[str, str, dict, list[tuple[int, int]]]) -> None:
    """One process's open_partial + fill of the shared folder (run in a pool of several at once)."""
    from modelvec.hub.partial import open_partial

    sha, endpoint_cache, _, spans = args
    endpoint, cache = endpoint_cache.split("|")
    hub_settings = HubSettings(endpoint=endpoint, cache_dir=cache, token=False, retries=2, backoff=0.01)
    folder = open_partial(REPO, sha, None, hub_settings)
    assert folder is not None
    folder.fill({FILE: spans}, hub_settings)


def test_processes_sharing_a_partial_folder_never_lose_each_others_bytes(server, hub_settings, weights):
    """Several processes (Ray workers, two runs) open and fill one partial download at once: none truncates what
    another fetched, and the marker lists every range fetched, each holding the file's own bytes."""
    import multiprocessing

    from modelvec.core.partial import read_marker
    from modelvec.hub.partial import partial_folder

    data, sha = weights
    start = len(data) // 3  # past the header
    parts = [[(start + i * 40_000, start + i * 40_000 + 30_000)] for i in range(6)]
    job = f"{server.endpoint}|{hub_settings.cache_dir}"
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        pool.map(_open_and_fill, [(sha, job, {}, spans) for spans in parts])
    folder = partial_folder(REPO, sha, hub_settings)
    marker = read_marker(folder)
    assert marker is not None
    held = marker.files
    got = (folder / FILE).read_bytes()
    for [(a, b)] in parts:
        assert any(lo <= a and b <= hi for lo, hi in held[FILE]), (a, b, held[FILE])
        assert got[a:b] == data[a:b]


def test_shards_share_one_pool_and_a_finished_shard_is_recorded_when_another_fails(hub, server, hub_settings):
    """A sharded checkpoint's ranges go out together (the last range of one shard does not hold up the next), and a
    shard whose ranges all arrived is recorded as held even when another shard fails for good."""
    from modelvec.core.partial import read_marker
    from modelvec.hub.partial import open_partial

    rng = np.random.default_rng(1)
    shards = {
        f"model-0000{i}-of-00002.safetensors": save(
            {f"layer.{i}.weight": rng.standard_normal((64, 1024)).astype(np.float32)}, metadata={"format": "pt"}
        )
        for (i,) in [(1,), (2,)]
    }
    index = {"metadata": {}, "weight_map": {f"layer.{i}.weight": f"model-0000{i}-of-00002.safetensors" for i in (1, 2)}}
    sha = hub.publish(
        REPO, {**shards, "model.safetensors.index.json": json.dumps(index).encode(), "config.json": b"{}"}
    )
    folder = open_partial(REPO, sha, None, hub_settings)
    assert folder is not None
    first, second = sorted(shards)
    wanted = {
        name: [(len(data) // 2 + k * 40_000, len(data) // 2 + k * 40_000 + 25_000) for k in range(3)]
        for name, data in shards.items()
    }
    hub.fail(f"*/{first}", kind="slow", delay=0.5, times=1)  # the first shard's first range stalls
    before = len(server.requests)
    folder.fill(wanted, hub_settings)
    order = [r["path"].rsplit("/", 1)[-1] for r in server.requests[before:] if r["method"] == "GET"]
    assert order == [second, first]  # one request a shard (coalesced): the second answered while the first stalled
    for name, data in shards.items():
        got = (folder.path / name).read_bytes()
        assert all(got[a:b] == data[a:b] for a, b in wanted[name])
    more = {name: [(a + 10_000, b + 10_000) for a, b in spans] for name, spans in wanted.items()}
    hub.fail(f"*/{first}", kind="bad-content-range", times=None)
    patient = dataclasses.replace(hub_settings, backoff=0.3)  # the first fails after its retries: the second is done
    with pytest.raises(FetchError, match=first):
        folder.fill(more, patient)
    held = read_marker(folder.path).files
    assert all(any(lo <= a and b <= hi for lo, hi in held[second]) for a, b in more[second])  # kept
    assert not any(any(lo <= a and b <= hi for lo, hi in held[first]) for a, b in more[first])


def test_a_released_partial_download_takes_its_lock_and_leaves_nothing_behind(server, hub_settings, weights):
    """``release_partial`` waits for whoever holds the folder's lock, then deletes the folder and its lock file, so
    that the folder of partial downloads, left empty, goes too."""
    import threading

    from modelvec.hub.partial import open_partial, release_partial

    data, sha = weights
    folder = open_partial(REPO, sha, None, hub_settings)
    assert folder is not None
    folder.fill({FILE: [(len(data) // 2, len(data) // 2 + 30_000)]}, hub_settings)
    assert folder.lock_path.is_file()
    held, go = threading.Event(), threading.Event()

    def hold() -> None:
        with folder.locked():
            held.set()
            go.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    freed: list[int] = []
    releaser = threading.Thread(target=lambda: freed.append(release_partial(REPO, sha, hub_settings)))
    releaser.start()
    releaser.join(0.3)
    assert releaser.is_alive() and folder.path.is_dir()  # waits for the lock
    go.set()
    holder.join(10)
    releaser.join(10)
    assert freed and freed[0] > 0
    assert not folder.path.exists() and not folder.lock_path.exists()
    assert not folder.path.parent.exists()  # the folder of partial downloads, left empty, is gone
    assert release_partial(REPO, sha, hub_settings) == 0
    again = open_partial(REPO, sha, None, hub_settings)  # made again afresh, under a new lock file
    assert again is not None and again.path.is_dir() and again.lock_path.is_file()
