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
import re
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from huggingface_hub import constants, hf_hub_download
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from ..core.errors import CheckpointError, CorruptDownload, FetchError, ModelvecError, UnsafeHubName
from ..core.files import (
    BIN_INDEX,
    CONFIG,
    SAFETENSORS_INDEX,
    SHARD_SUFFIX,
    WEIGHT_FORMATS,
    adapter_files,
    formats,
    weight_format,
)
from .client import HubSettings, describe_error, with_retries
from .guard import guard_hub_client
from .ids import is_commit_sha

_SHA256 = re.compile(r"[0-9a-f]{64}")
_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
#: Files of one snapshot downloaded at once (a sharded checkpoint's shards).
MAX_WORKERS = 4


def check_repo_id(repo_id: str) -> str:
    """``repo_id`` if it is a valid Hub id (``name`` or ``owner/name``, no ``..``); a FetchError otherwise."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise FetchError(str(repo_id)[:200], f"not a valid Hub repository id: {str(exc).splitlines()[0]}") from None
    return repo_id


def check_revision(repo_id: str, revision: str) -> str:
    """A commit sha or a plain ref name (``main``, ``refs/pr/1``): nothing that could be a path elsewhere."""
    text = str(revision)
    if is_commit_sha(text) or (len(text) <= 255 and _REF.fullmatch(text) and ".." not in text):
        return text
    raise FetchError(repo_id, f"the Hub gave an unusable revision {text[:80]!r} (not a commit sha or a ref name)")


def check_filename(repo_id: str, name: str) -> str:
    """A file name from the Hub that stays inside a snapshot folder: relative, ``/``-separated, no ``..``."""
    parts = name.split("/") if isinstance(name, str) else []
    bad = (
        not parts
        or len(name) > 1024
        or name.startswith("/")
        or any(p in ("", ".", "..") or len(p.encode("utf-8", "surrogatepass")) > 255 for p in parts)
        or any(c in "\\:" or ord(c) < 32 or ord(c) == 127 for c in name)
    )
    if bad:
        raise FetchError(repo_id, f"refused the file name {str(name)[:80]!r} from the Hub: not a plain relative path")
    return name


def shard_names(repo_id: str, fmt: str, index: Any, marker: str) -> list[str]:
    """The shard files an index names, each checked (a safe name with the format's suffix)."""
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(repo_id, f"{marker} has no weight_map of tensor -> file name")
    shards = sorted(set(weight_map.values()))
    if not shards:
        raise CheckpointError(repo_id, f"{marker} lists no shards")
    for shard in shards:
        check_filename(repo_id, shard)
        if not shard.endswith(SHARD_SUFFIX[fmt]):
            raise CheckpointError(repo_id, f"{marker} names {shard[:80]!r}, not a {SHARD_SUFFIX[fmt]} shard")
    return shards


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
        wanted = ["config.json"] if "config.json" in files else []
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
    left = _read_journal(journal)
    fresh = [n for n in wanted if left is None or n in left or not (snapshot / n).is_file()]
    if not fresh:  # all there and checked: nothing to ask the Hub (a repository gone since is still served)
        return snapshot
    others = sorted(left - set(wanted)) if left else []  # left by a fetch that wanted other files: kept
    _write_journal(journal, fresh + others)

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
    _write_journal(journal, others)
    return snapshot


def _read_journal(journal: Path) -> set[str] | None:
    """The names a killed fetch had yet to check (empty when none); None when the journal is unreadable (check all)."""
    try:
        names = json.loads(journal.read_text())
    except FileNotFoundError:
        return set()
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else None


def _write_journal(journal: Path, names: Sequence[str]) -> None:
    """The journal of :func:`_snapshot` lists ``names`` (deleted when there are none). Best effort: a read-only cache
    still serves offline, without one."""
    with contextlib.suppress(OSError):
        if names:
            write_atomic(journal, json.dumps(sorted(set(names))))
        else:
            journal.unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    """``path`` holds ``text``, whole or not at all (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


def tree_listing(repo: Path, revision: str) -> Path:
    """Where huggingface_hub keeps the tree listing of a commit that a ``snapshot_download`` made, in a repository's
    cache folder (documented in its ``_tree_cache`` module; a test of this module fails if it moves)."""
    return repo / "trees" / f"{revision}.json"


def drop_unsafe_listing(repo: Path, revision: str) -> None:
    """Delete a cached tree listing of ``revision`` whose names huggingface_hub would use outside the cache.

    ``hf_hub_download`` (with hf_xet installed) takes a file's metadata from a listing that another tool's
    ``snapshot_download`` cached, without the file's (guarded) HEAD, and names the blob and its lock by the
    listing's LFS sha256. modelvec writes no listing; one cached from a hostile endpoint by someone else is
    checked here: an LFS sha256 or Xet hash that is not 64 hex digits makes the listing go (huggingface_hub then
    asks for the file's HEAD). An :class:`UnsafeHubName` when it cannot be deleted.
    """
    listing = tree_listing(repo, revision)
    try:
        files = json.loads(listing.read_text(encoding="utf-8")).get("files")
    except FileNotFoundError:
        return
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        files = None  # unreadable: huggingface_hub ignores it too, but it goes all the same
    plain = isinstance(files, dict) and all(
        isinstance(entry, dict)
        and all(
            entry.get(k) is None or (isinstance(entry[k], str) and _SHA256.fullmatch(entry[k]))
            for k in ("lfs_sha256", "xet_hash")
        )
        for entry in files.values()
    )
    if plain:
        return
    try:
        listing.unlink(missing_ok=True)  # gone already: another thread fetching this commit dropped it
    except OSError as exc:
        raise UnsafeHubName(
            f"the cached tree listing {listing} names blobs outside the cache and cannot be deleted: {exc}"
        ) from None


def verify(path: str | os.PathLike[str], filename: str, repo: Path | None = None) -> None:
    """Check a downloaded file against the sha256 its blob is named by (the Hub's ETag of an LFS file).

    huggingface_hub checks only the size of a plain HTTP download. A blob named by a 64-hex ETag whose
    bytes hash to something else (a corrupting proxy, a body that differs from what the HEAD announced)
    is deleted with its snapshot link and :class:`CorruptDownload` is raised, which is retried. Blobs named
    otherwise (a git sha1 ETag: small non-LFS files) are not checked.
    """
    link = Path(path)
    blob = Path(os.path.realpath(link))
    if not _SHA256.fullmatch(blob.name):
        return
    with open(blob, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if digest != blob.name:
        if repo is None or Path(os.path.realpath(repo)) in blob.parents:
            blob.unlink(missing_ok=True)
        link.unlink(missing_ok=True)
        raise CorruptDownload(f"{filename}: sha256 {digest[:12]}... but the Hub announced {blob.name[:12]}...")


def repo_folder(repo_id: str, hub_settings: HubSettings) -> Path:
    """The repository's folder in the cache, named as huggingface_hub names it (``~`` expanded, absolute)."""
    cache = Path(hub_settings.cache_dir or constants.HF_HUB_CACHE).expanduser().resolve()
    return cache / ("models--" + repo_id.replace("/", "--"))


def list_files(repo_id: str, revision: str, hub_settings: HubSettings) -> list[str]:
    if hub_settings.offline:
        folder = snapshot_folder(repo_id, revision, hub_settings)
        if folder is None:
            raise FetchError(repo_id, f"offline (HF_HUB_OFFLINE=1) and revision {revision[:12]} is not in the cache")
        return [p.name for p in folder.iterdir()]
    info = with_retries(lambda: hub_settings.api().model_info(repo_id, revision=revision), hub_settings, repo_id)
    return [s.rfilename for s in info.siblings or []]


def snapshot_folder(repo_id: str, revision: str, hub_settings: HubSettings) -> Path | None:
    """The cached snapshot of ``repo_id`` at a commit sha (or branch), if the cache holds one."""
    check_repo_id(repo_id)
    check_revision(repo_id, revision)
    repo = repo_folder(repo_id, hub_settings)
    sha = revision
    if not is_commit_sha(revision):
        ref = repo / "refs" / revision
        if not ref.is_file():
            return None
        sha = ref.read_text().strip()
        if not is_commit_sha(sha):
            return None
    folder = repo / "snapshots" / sha
    return folder if folder.is_dir() else None


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


def release(repo_id: str, revision: str, hub_settings: HubSettings) -> int:
    """Delete one cached revision of a repository (its blobs too, unless another revision shares them).

    Used with ``--no-keep-weights`` once a fine-tune is embedded; other revisions and other
    repositories (the base) are untouched. Only this repository's folder is looked at, so it is
    safe while other models download into the same cache (a whole-cache scan is not).
    A revision that is not a commit sha, or a repository id that is not a Hub id, has no snapshot of
    its own (it may come from a hostile listing): nothing is deleted. Nothing outside the repository's
    folder is ever deleted, whatever the links in the snapshot point to.
    """
    try:
        check_repo_id(repo_id)
    except FetchError:
        return 0
    if not is_commit_sha(revision):
        return 0
    repo = repo_folder(repo_id, hub_settings)
    snapshot = repo / "snapshots" / revision
    if snapshot.is_symlink() or not snapshot.is_dir():
        return 0
    real_repo = Path(os.path.realpath(repo))
    others = {
        os.path.realpath(p)
        for other in (repo / "snapshots").iterdir()
        if other.name != revision
        for p in other.rglob("*")
    }
    freed = 0
    for link in sorted(snapshot.rglob("*"), reverse=True):  # rglob does not descend into linked folders
        if link.is_symlink():
            target = Path(os.path.realpath(link))
            if str(target) not in others and target.is_file() and real_repo in target.parents:
                freed += target.stat().st_size
                target.unlink()
            link.unlink()
        elif link.is_file():  # a copy (no symlinks on this file system)
            freed += link.stat().st_size
            link.unlink()
        elif link.is_dir():
            link.rmdir()
    snapshot.rmdir()
    journal = repo / ".modelvec" / f"{revision}.unverified"  # nothing of this revision is left to check
    if not journal.parent.is_symlink():
        with contextlib.suppress(OSError):
            journal.unlink(missing_ok=True)
            journal.parent.rmdir()  # only when empty
    return freed


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
