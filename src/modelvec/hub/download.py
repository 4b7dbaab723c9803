"""Fetching only what the vectors need from the Hub, pinned to a revision, and letting it go.

A model's vector needs its ``config.json`` and its weights in the best format it has: safetensors
(single or sharded through its index), else PyTorch ``.bin`` (single or sharded). TensorFlow,
Flax, ONNX, optimizer states and training files are never downloaded. Once the wanted files are
known (a sharded checkpoint's index is fetched first: it names the shards), each comes through
``huggingface_hub.hf_hub_download`` (``MAX_WORKERS`` at a time) into the huggingface_hub cache
(``HF_HUB_CACHE``), pinned to the commit sha recorded at discovery, so a repository whose ``main``
moves on still gives the vector of the revision in the catalogue, and ``HF_HUB_OFFLINE=1`` works from
the cache. Every file is asked for by name with its own HEAD, which :mod:`modelvec.hub.guard` checks;
modelvec lists no tree and writes no tree listing for huggingface_hub to trust. :func:`release` deletes
a fine-tune's files once embedded so thousands of models fit on one disk. (Where a representation
reads only a share of rows, :mod:`modelvec.hub.partial` fetches byte ranges instead.)

Nothing the Hub says is trusted as a path: repository ids, revisions and the shard names of an
index are checked before they reach the disk (huggingface_hub refuses ``..`` and absolute file
names but writes ``refs/<revision>`` for any revision it is given), a freshly downloaded file whose
ETag is a sha256 (every LFS file: the weights) is hashed and refused, then fetched again, when its
bytes do not match (files downloaded by a process that was killed before it could check them are
checked by the next fetch: see :func:`_snapshot`), and :func:`release` only deletes inside the
repository's own folder. huggingface_hub writes each download to ``<blob>.<random>.incomplete`` and
renames it when the size matches, so a killed or broken transfer never leaves a short file in a
snapshot.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from huggingface_hub import hf_hub_download

from ..core.errors import CheckpointError, CorruptDownload, FetchError, ModelvecError
from ..core.files import (
    BIN_INDEX,
    CONFIG,
    QUANT_CONFIGS,
    SAFETENSORS_INDEX,
    WEIGHT_FORMATS,
    adapter_files,
    formats,
    weight_format,
)
from .cache import (
    drop_unsafe_listing,
    read_journal,
    repo_folder,
    snapshot_folder,
    verify,
    write_atomic,
    write_journal,
)
from .client import HubSettings, describe_error, with_retries
from .guard import guard_hub_client
from .ids import is_commit_sha
from .names import check_filename, check_repo_id, check_revision, shard_names

#: Files of one snapshot downloaded at once (a sharded checkpoint's shards).
MAX_WORKERS = 4


def fetch(repo_id: str, revision: str, files: Sequence[str] | None, hub_settings: HubSettings) -> Path:
    """Download ``config.json`` and the best weights of ``repo_id`` at ``revision``; the snapshot folder.

    ``files`` is the repository's file list at that revision (from discovery); None asks the Hub,
    or, offline, looks in the cache. Sharded checkpoints come through their index.
    """
    check_repo_id(repo_id)
    check_revision(repo_id, revision)
    try:
        if not is_commit_sha(revision):  # pinned from here on: every file comes from the same commit
            revision = pin(repo_id, revision, hub_settings)
        if files is None:
            files = list_files(repo_id, revision, hub_settings)
        fmt = weight_format(files)
        adapter = adapter_files(files) if fmt is None else None
        if adapter is not None:  # a PEFT adapter: adapter_config.json + adapter_model.safetensors (else .bin)
            return _snapshot(repo_id, revision, adapter, hub_settings)
        if fmt is None:
            have = ", ".join(formats(files)) or "no weight files"
            raise CheckpointError(repo_id, f"no PyTorch weights to read (the repository has: {have})")
        wanted = [name for name in ("config.json", *QUANT_CONFIGS) if name in files]  # a quantizer's config too
        marker = dict(WEIGHT_FORMATS)[fmt]
        wanted.append(marker)
        if fmt.endswith("-sharded"):  # the index first: it names the shards
            try:
                index = json.loads(Path(download_file(repo_id, marker, revision, hub_settings)).read_text())
            except (ValueError, UnicodeDecodeError) as exc:
                raise CheckpointError(repo_id, f"{marker} is not JSON: {str(exc).splitlines()[0]}") from None
            wanted += shard_names(repo_id, fmt, index, marker)
        return _snapshot(repo_id, revision, wanted, hub_settings)
    except ModelvecError:
        raise
    except Exception as exc:
        raise FetchError(repo_id, f"could not fetch revision {revision[:12]}: {describe_error(exc)}") from exc


#: The files a tokenizer may need, fetched beside the weights where a model is to be run (the probe)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
)


def fetch_runnable(repo_id: str, revision: str, hub_settings: HubSettings) -> Path:
    """Everything that running ``repo_id`` at ``revision`` needs: its configuration, all its weights and its
    tokenizer's files (the base, once, for the probe: a fine-tune's vector never needs more than :func:`fetch`)."""
    try:
        files = list_files(repo_id, revision, hub_settings)  # once: fetch would list them again without it
    except ModelvecError:
        raise
    except Exception as exc:
        raise FetchError(repo_id, f"could not list revision {revision[:12]}: {describe_error(exc)}") from exc
    folder = fetch(repo_id, revision, files, hub_settings)
    try:
        wanted = [name for name in TOKENIZER_FILES if name in files]
        return _snapshot(repo_id, revision, wanted, hub_settings) if wanted else folder
    except ModelvecError:
        raise
    except Exception as exc:
        raise FetchError(repo_id, f"could not fetch its tokenizer: {describe_error(exc)}") from exc


def _snapshot(repo_id: str, revision: str, wanted: Sequence[str], hub_settings: HubSettings) -> Path:
    """The files ``wanted`` of ``repo_id`` at commit ``revision``, each through :func:`download_file`
    (``MAX_WORKERS`` at once); the snapshot folder.

    A file already in the snapshot is trusted only once checked: the names a fetch has yet to check are
    written down first (``<repo>/.modelvec/<revision>.unverified``) and crossed off once every wanted file is
    there and checked, so a process killed in between leaves them to be checked (:func:`verify`) by the next
    fetch, which fetches a file again when its bytes do not match. A file the Hub does not have fails as a
    missing file does.
    """
    for name in wanted:
        check_filename(repo_id, name)
    repo = repo_folder(repo_id, hub_settings)
    snapshot = repo / "snapshots" / revision
    journal = repo / ".modelvec" / f"{revision}.unverified"
    left = read_journal(journal)
    fresh = [n for n in wanted if left is None or n in left or not (snapshot / n).is_file()]
    if not fresh:  # all there and checked: nothing to ask the Hub (a repository gone since is still served)
        return snapshot
    others = sorted(left - set(wanted)) if left else []  # left by a fetch that wanted other files: kept
    write_journal(journal, fresh + others)

    def one(name: str) -> None:
        there = snapshot / name
        if there.is_file():  # left unchecked by a killed fetch
            try:
                verify(there, name, repo)
                return
            except CorruptDownload:  # deleted: fetched again
                pass
        download_file(repo_id, name, revision, hub_settings)

    with ThreadPoolExecutor(max(1, min(MAX_WORKERS, len(fresh))), thread_name_prefix="modelvec-fetch") as pool:
        for future in [pool.submit(one, name) for name in fresh]:
            future.result()  # the first failure is the fetch's
    write_journal(journal, others)
    return snapshot


def pin(repo_id: str, revision: str, hub_settings: HubSettings) -> str:
    """The commit sha of a branch or tag (see :func:`resolve_revision`), recorded in the cache's ``refs/`` as
    huggingface_hub does, so that the branch is found offline later."""
    sha = resolve_revision(repo_id, revision, hub_settings)
    if not hub_settings.offline:
        ref = repo_folder(repo_id, hub_settings) / "refs" / revision  # a checked ref name: stays inside refs/
        with contextlib.suppress(OSError):
            if not (ref.is_file() and ref.read_text() == sha):
                write_atomic(ref, sha)
    return sha


#: The most bytes a small JSON file (config.json, adapter_config.json, a shard index) may have when it comes by one
#: GET (:func:`_get_small`): far above any real one.
SMALL_MAX = 16 << 20


def download_file(repo_id: str, filename: str, revision: str, hub_settings: HubSettings) -> str:
    """One file through the cache; a fresh download is checked against its sha256 ETag (see :func:`verify`).

    A JSON file at a commit sha (config.json, adapter_config.json, a shard index: small, never LFS) comes by one GET
    (:func:`_get_small`) instead of huggingface_hub's HEAD then GET: one request a model fewer."""
    check_filename(repo_id, filename)
    repo = repo_folder(repo_id, hub_settings)
    pointer = repo / "snapshots" / revision / filename if is_commit_sha(revision) else None

    def attempt() -> str:
        cached = pointer is not None and pointer.is_file()
        if cached:
            return str(pointer)
        if pointer is not None and filename.endswith(".json") and not hub_settings.offline:
            return _get_small(repo_id, filename, revision, hub_settings, repo)
        if not cached and is_commit_sha(revision) and not hub_settings.offline:
            drop_unsafe_listing(repo, revision)
        path = _hub_file(repo_id, filename, revision, hub_settings)
        if not cached:
            verify(path, filename, repo)
        return path

    return with_retries(attempt, hub_settings, f"{repo_id}/{filename}")


def _get_small(repo_id: str, filename: str, revision: str, hub_settings: HubSettings, repo: Path) -> str:
    """A small file at commit ``revision`` by one GET, into the cache as huggingface_hub lays it out: the blob named
    by its own sha256 (nothing the Hub says becomes a path), the snapshot's link to it."""
    from huggingface_hub import get_session, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    guard_hub_client()
    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=hub_settings.endpoint)
    headers = build_hf_headers(token=hub_settings.token)
    with get_session().stream(
        "GET", url, headers=headers, follow_redirects=True, timeout=hub_settings.timeout
    ) as response:
        hf_raise_for_status(response)
        data = bytearray()
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) > SMALL_MAX:
                raise CheckpointError(repo_id, f"{filename} is over {SMALL_MAX >> 20} MiB: not a small JSON file")
        announced = response.headers.get("Content-Length")
    if announced is not None and announced.isdigit() and int(announced) != len(data):
        raise OSError(f"Consistency check failed: {filename} announced {announced} bytes, got {len(data)}")
    digest = hashlib.sha256(data).hexdigest()
    blob = repo / "blobs" / digest
    if not blob.is_file():
        blob.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=blob.parent, prefix=f".{digest[:12]}.", suffix=".incomplete")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, blob)
    link = repo / "snapshots" / revision / filename
    link.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(blob, link.parent)
    tmp_link = link.parent / f".{link.name}.{os.getpid()}.{threading.get_ident()}.link"
    tmp_link.unlink(missing_ok=True)
    os.symlink(target, tmp_link)
    os.replace(tmp_link, link)
    return str(link)


def list_files(repo_id: str, revision: str, hub_settings: HubSettings) -> list[str]:
    if hub_settings.offline:
        folder = snapshot_folder(repo_id, revision, hub_settings)
        if folder is None:
            raise FetchError(repo_id, f"offline (HF_HUB_OFFLINE=1) and revision {revision[:12]} is not in the cache")
        return [p.name for p in folder.iterdir()]
    info = with_retries(lambda: hub_settings.api().model_info(repo_id, revision=revision), hub_settings, repo_id)
    return [s.rfilename for s in info.siblings or []]


def resolve_revision(repo_id: str, revision: str, hub_settings: HubSettings) -> str:
    """The commit sha of a branch (online: asks the Hub; offline: the cache's ref)."""
    if is_commit_sha(revision):
        return revision
    check_repo_id(repo_id)
    check_revision(repo_id, revision)
    if hub_settings.offline:
        folder = snapshot_folder(repo_id, revision, hub_settings)
        if folder is None:
            raise FetchError(repo_id, f"offline (HF_HUB_OFFLINE=1) and '{revision}' is not in the cache")
        return folder.name
    try:
        info = with_retries(lambda: hub_settings.api().model_info(repo_id, revision=revision), hub_settings, repo_id)
    except Exception as exc:
        raise FetchError(repo_id, describe_error(exc)) from exc
    if not is_commit_sha(str(info.sha)):
        raise FetchError(repo_id, f"the Hub gave {str(info.sha)[:80]!r} as the commit of '{revision}', not a sha")
    return str(info.sha)


def weights_identity(repo_id: str, revision: str, hub_settings: HubSettings) -> str | None:
    """What a commit's weights are, from the Hub's listing of its files alone (nothing downloaded): a hash of the
    top-level weight files' names and contents (an LFS file's sha256, another's git blob id) with the config and the
    shard indexes. Two commits with one identity hold the same weights (a commit that changed only the card, say).
    None where the commit lists no weight files, or is not on the Hub any more; a Hub that cannot be reached is a
    :class:`FetchError`."""
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    check_repo_id(repo_id)
    try:
        info = with_retries(
            lambda: hub_settings.api().model_info(repo_id, revision=revision, files_metadata=True),
            hub_settings,
            repo_id,
        )
    except (RevisionNotFoundError, RepositoryNotFoundError):
        return None
    except Exception as exc:
        raise FetchError(repo_id, describe_error(exc)) from exc
    weights = [
        (s.rfilename, s.lfs.sha256 if s.lfs is not None else s.blob_id)
        for s in info.siblings or ()
        if "/" not in s.rfilename and Path(s.rfilename).suffix in (".safetensors", ".bin")
    ]
    if not weights or any(digest is None for _, digest in weights):
        return None
    described = [
        (s.rfilename, s.blob_id) for s in info.siblings or () if s.rfilename in (CONFIG, SAFETENSORS_INDEX, BIN_INDEX)
    ]
    return "weights:" + hashlib.sha256(json.dumps(sorted(weights + described)).encode()).hexdigest()


def _hub_file(repo_id: str, filename: str, revision: str, hub_settings: HubSettings) -> str:
    """One file through huggingface_hub's cache, with the settings' endpoint, token and timeout."""
    return hf_hub_download(
        repo_id,
        filename,
        revision=revision,
        cache_dir=hub_settings.cache_dir,
        endpoint=hub_settings.endpoint,
        token=hub_settings.token,
        etag_timeout=hub_settings.timeout,
    )
