"""Fetching only what the vectors need from the Hub, pinned to a revision, and letting it go.

A model's vector needs its ``config.json`` and its weights in the best format it has: safetensors
(single or sharded through its index), else PyTorch ``.bin`` (single or sharded). TensorFlow,
Flax, ONNX, optimizer states and training files are never downloaded. Once the wanted files are
known (a sharded checkpoint's index is fetched first: it names the shards), they come in one
``huggingface_hub.snapshot_download`` whose ``allow_patterns`` are exactly their names, through the
huggingface_hub cache (``HF_HUB_CACHE``), pinned to the commit sha recorded at discovery (its tree is
listed once, checked and cached, so ``snapshot_download`` neither asks which commit a branch is nor
lists the tree again), so a repository whose ``main`` moves on still gives the vector of the revision
in the catalogue, and ``HF_HUB_OFFLINE=1`` works from the cache. :func:`release` deletes a fine-tune's files once
embedded so thousands of models fit on one disk.

Nothing the Hub says is trusted as a path: repository ids, revisions and the shard names of an
index are checked before they reach the disk (huggingface_hub refuses ``..`` and absolute file
names but writes ``refs/<revision>`` for any revision it is given), the names of the Hub's tree
listing are only matched against the wanted names (never globbed: ``*``, ``?`` and ``[`` are taken
literally) and its LFS sha256s, which huggingface_hub would use as blob names, must be plain ones
(see :func:`_list_tree`), a freshly downloaded file whose ETag is a sha256 (every LFS file: the weights) is hashed
and refused, then fetched again, when its bytes do not match (files downloaded by a process that was
killed before it could check them are checked by the next fetch: see :func:`_snapshot`), and
:func:`release` only deletes inside the repository's own folder.
huggingface_hub writes each download to ``<blob>.<random>.incomplete`` and renames it when the
size matches, so a killed or broken transfer never leaves a short file in a snapshot.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx2
from huggingface_hub import constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff, validate_repo_id

try:  # where snapshot_download caches tree listings (private to huggingface_hub 2.x): see _list_tree
    from huggingface_hub import _tree_cache
except ImportError:  # pragma: no cover - another huggingface_hub: files are then fetched by name
    _tree_cache = None  # type: ignore[assignment]

from ..core.errors import CheckpointError, FetchError, ModelvecError
from ..core.files import SHARD_SUFFIX, WEIGHT_FORMATS, adapter_files, formats, weight_format
from .client import CorruptDownload, HubSettings, describe_error, with_retries
from .guard import UnsafeHubName
from .ids import is_commit_sha

_SHA256 = re.compile(r"[0-9a-f]{64}")
_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
_GLOB = re.compile(r"[*?[]")
#: Files of one snapshot downloaded at once (a sharded checkpoint's shards).
MAX_WORKERS = 4
_TREE_PAGES = 1000


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


def fetch(repo_id: str, revision: str, files: Sequence[str] | None, settings: HubSettings) -> Path:
    """Download ``config.json`` and the best weights of ``repo_id`` at ``revision``; the snapshot folder.

    ``files`` is the repository's file list at that revision (from discovery); None asks the Hub,
    or, offline, looks in the cache. Sharded checkpoints come through their index.
    """
    check_repo_id(repo_id)
    check_revision(repo_id, revision)
    try:
        if not is_commit_sha(revision):  # pinned from here on: every file comes from the same commit
            revision = pin(repo_id, revision, settings)
        if files is None:
            files = list_files(repo_id, revision, settings)
        fmt = weight_format(files)
        adapter = adapter_files(files) if fmt is None else None
        if adapter is not None:  # a PEFT adapter: adapter_config.json + adapter_model.safetensors (else .bin)
            return _snapshot(repo_id, revision, adapter, settings)
        if fmt is None:
            have = ", ".join(formats(files)) or "no weight files"
            raise CheckpointError(repo_id, f"no PyTorch weights to read (the repository has: {have})")
        wanted = ["config.json"] if "config.json" in files else []
        marker = dict(WEIGHT_FORMATS)[fmt]
        wanted.append(marker)
        if fmt.endswith("-sharded"):  # the index first: it names the shards
            try:
                index = json.loads(Path(download_file(repo_id, marker, revision, settings)).read_text())
            except (ValueError, UnicodeDecodeError) as exc:
                raise CheckpointError(repo_id, f"{marker} is not JSON: {str(exc).splitlines()[0]}") from None
            wanted += shard_names(repo_id, fmt, index, marker)
        return _snapshot(repo_id, revision, wanted, settings)
    except ModelvecError:
        raise
    except Exception as exc:
        raise FetchError(repo_id, f"could not fetch revision {revision[:12]}: {describe_error(exc)}") from exc


def _snapshot(repo_id: str, revision: str, wanted: Sequence[str], settings: HubSettings) -> Path:
    """The files ``wanted`` of ``repo_id`` at commit ``revision``, in one ``snapshot_download``; the snapshot folder.

    Every wanted file that was not in the snapshot before an attempt is checked afterwards (:func:`verify`), also
    when the attempt failed halfway (the files it did finish); a :class:`CorruptDownload` makes :func:`with_retries`
    try the whole attempt again, which fetches only what is missing. A file the tree listing of the Hub does not show
    (or, offline, that the cache lacks) is asked for by name, so its absence fails as a missing file does; so is every
    file when the tree cannot be listed at all (a mirror without the tree API, a listing that keeps failing). The
    listing is made and checked here, and cached for ``snapshot_download`` (see :func:`_list_tree`). The names
    an attempt has yet to check are written down first (``<repo>/.modelvec/<revision>.unverified``) and crossed off
    once checked, so a process killed in between leaves them to be checked by the next fetch, not trusted.
    """
    for name in wanted:
        check_filename(repo_id, name)
    repo = repo_folder(repo_id, settings)
    snapshot = repo / "snapshots" / revision
    journal = repo / ".modelvec" / f"{revision}.unverified"

    def attempt() -> Path:
        left = _read_journal(journal)
        fresh = [n for n in wanted if left is None or n in left or not (snapshot / n).is_file()]
        others = sorted(left - set(wanted)) if left else []  # left by a fetch that wanted other files: kept
        if fresh:
            _write_journal(journal, fresh + others)

        def check() -> None:
            bad = []
            for name in fresh:
                if (snapshot / name).is_file():
                    try:
                        verify(snapshot / name, name, repo)
                    except CorruptDownload as exc:  # deleted: fetched again by the next attempt
                        bad.append(exc)
            if fresh:
                _write_journal(journal, others)
            if bad:
                raise bad[0]

        if not fresh:  # all there and checked: nothing to ask the Hub (a repository gone since is still served)
            return snapshot
        try:
            if settings.offline or _list_tree(repo_id, revision, repo, settings):
                snapshot_download(
                    repo_id,
                    revision=revision,
                    allow_patterns=[_literal(n) for n in wanted],
                    cache_dir=settings.cache_dir,
                    endpoint=settings.endpoint,
                    token=settings.token,
                    etag_timeout=settings.timeout,
                    max_workers=MAX_WORKERS,
                    local_files_only=settings.offline,
                )
            for name in wanted:
                if not (snapshot / name).is_file():  # not in the Hub's tree listing: its own error, if any
                    _hub_file(repo_id, name, revision, settings)
        except BaseException:
            with contextlib.suppress(Exception):  # what did arrive is checked; the failure is what is reported
                check()
            raise
        check()
        return snapshot

    return with_retries(attempt, settings, repo_id)


def _list_tree(repo_id: str, revision: str, repo: Path, settings: HubSettings) -> bool:
    """Whether the cache holds a listing of the tree of ``repo_id`` at commit ``revision`` that ``snapshot_download``
    can use (it then does not list the tree itself); lists it when needed. False when the tree cannot be listed (a
    mirror without the tree API, a malformed listing, one that failed past huggingface_hub's own retries): the files
    are then asked for by name.

    A listing is checked before it is used: huggingface_hub downloads a file to which a cached listing gives a Xet
    hash without asking for the file's HEAD, into a blob (and a lock file) named by the listing's LFS sha256, which no
    guard sees (:mod:`modelvec.hub.guard` checks HEAD answers). So an LFS sha256 that is not 64 hex digits is dropped,
    and a Xet hash is kept only beside a good one: such a file is asked for as any other (HEAD, guarded), or stored
    under a plain sha256, which :func:`verify` checks. A listing cached by someone else is cleaned the same way.
    """
    if _tree_cache is None:  # not the huggingface_hub this was written for: by name, as before snapshot_download
        return False
    if _clean_tree_cache(repo, revision) is not None:
        return True
    try:
        listing = {
            f.path: _tree_cache.TreeCacheEntry(
                size=f.size,
                blob_id=f.blob_id,
                lfs_sha256=f.lfs.sha256 if f.lfs is not None else None,
                lfs_size=f.lfs.size if f.lfs is not None else None,
                xet_hash=f.xet_hash,
            )
            for f in _tree_files(repo_id, revision, settings)
            if isinstance(f.path, str)
        }
    except (RepositoryNotFoundError, RevisionNotFoundError):  # gated too: the repository's own answer
        raise
    except (HfHubHTTPError, httpx2.HTTPError, KeyError, TypeError, ValueError, AttributeError):
        return False
    return _clean_tree_cache(repo, revision, listing) is not None


def _tree_files(repo_id: str, revision: str, settings: HubSettings) -> list[RepoFile]:
    """The files of ``HfApi.list_repo_tree(repo_id, recursive=True, revision=revision)``, each page's request bounded
    by :attr:`HubSettings.timeout` (huggingface_hub lets a listing wait for a stalled server for ever) and retried as
    the settings say, and at most ``_TREE_PAGES`` pages (the Hub's have 1000 entries)."""
    url: str | None = f"{(settings.endpoint or constants.ENDPOINT).rstrip('/')}/api/models/{repo_id}/tree/{revision}"
    params: dict[str, Any] | None = {"recursive": True, "expand": False}
    headers = build_hf_headers(token=settings.token)
    files: list[RepoFile] = []
    for _ in range(_TREE_PAGES):
        if url is None:
            break
        response = http_backoff(
            "GET",
            url,
            params=params,
            headers=headers,
            timeout=settings.timeout,
            max_retries=settings.retries,
            base_wait_time=settings.backoff,
            max_wait_time=settings.max_wait,
        )
        hf_raise_for_status(response)
        files += [RepoFile(**e) for e in response.json() if isinstance(e, dict) and e.get("type") == "file"]
        url, params = response.links.get("next", {}).get("url"), None  # the next page's link has the parameters
        if url is None:
            return files
    raise ValueError(f"the tree listing of {repo_id} goes on past {_TREE_PAGES} pages")


def _clean_tree_cache(repo: Path, revision: str, listing: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The tree listing cached for ``revision`` (``listing`` cached first, if given), rewritten without the names
    :func:`_safe_tree_entry` drops; None when there is none. A :class:`UnsafeHubName` when the cache holds such names
    and cannot be rewritten (read-only), as huggingface_hub would then use them."""
    if _tree_cache is None:  # pragma: no cover - another huggingface_hub
        return None
    folder = str(repo)  # snapshot_download's tree cache folder for a cache_dir download (cache resolved, as here)
    cached = listing if listing is not None else _tree_cache.read_tree_cache(folder, revision)
    if cached is None:
        return None
    safe = {path: _safe_tree_entry(entry) for path, entry in cached.items()}
    if listing is not None or safe != cached:
        _tree_cache.write_tree_cache(folder, revision, safe)
    now = _tree_cache.read_tree_cache(folder, revision)
    if now is not None and now != safe:
        raise UnsafeHubName(f"the cached tree listing {folder}/trees/{revision}.json names blobs outside the cache")
    return now


def _safe_tree_entry(entry: Any) -> Any:
    """A tree entry without an LFS sha256 that is no plain sha256, nor a Xet hash that is not beside one."""
    sha, size = entry.lfs_sha256, entry.lfs_size
    lfs = isinstance(sha, str) and bool(_SHA256.fullmatch(sha)) and isinstance(size, int)
    xet = entry.xet_hash if lfs and isinstance(entry.xet_hash, str) and _SHA256.fullmatch(entry.xet_hash) else None
    return _tree_cache.TreeCacheEntry(
        size=entry.size,
        blob_id=entry.blob_id,
        lfs_sha256=sha if lfs else None,
        lfs_size=size if lfs else None,
        xet_hash=xet,
    )


def _literal(name: str) -> str:
    """An fnmatch pattern (``allow_patterns``) that matches exactly ``name``."""
    return _GLOB.sub(lambda m: f"[{m.group()}]", name)


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


def pin(repo_id: str, revision: str, settings: HubSettings) -> str:
    """The commit sha of a branch or tag (see :func:`resolve_revision`), recorded in the cache's ``refs/`` as
    huggingface_hub does, so that the branch is found offline later."""
    sha = resolve_revision(repo_id, revision, settings)
    if not settings.offline:
        ref = repo_folder(repo_id, settings) / "refs" / revision  # a checked ref name: stays inside refs/
        with contextlib.suppress(OSError):
            if not (ref.is_file() and ref.read_text() == sha):
                write_atomic(ref, sha)
    return sha


def download_file(repo_id: str, filename: str, revision: str, settings: HubSettings) -> str:
    """One file through the cache; a fresh download is checked against its sha256 ETag (see :func:`verify`)."""
    check_filename(repo_id, filename)
    repo = repo_folder(repo_id, settings)
    pointer = repo / "snapshots" / revision / filename if is_commit_sha(revision) else None

    def attempt() -> str:
        cached = pointer is not None and pointer.is_file()
        if not cached and pointer is not None and not settings.offline:
            _clean_tree_cache(repo, revision)  # huggingface_hub may use a cached listing in place of the HEAD
        path = _hub_file(repo_id, filename, revision, settings)
        if not cached:
            verify(path, filename, repo)
        return path

    return with_retries(attempt, settings, f"{repo_id}/{filename}")


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


def repo_folder(repo_id: str, settings: HubSettings) -> Path:
    """The repository's folder in the cache, named as huggingface_hub names it (``~`` expanded, absolute)."""
    cache = Path(settings.cache_dir or constants.HF_HUB_CACHE).expanduser().resolve()
    return cache / ("models--" + repo_id.replace("/", "--"))


def list_files(repo_id: str, revision: str, settings: HubSettings) -> list[str]:
    if settings.offline:
        folder = snapshot_folder(repo_id, revision, settings)
        if folder is None:
            raise FetchError(repo_id, f"offline (HF_HUB_OFFLINE=1) and revision {revision[:12]} is not in the cache")
        return [p.name for p in folder.iterdir()]
    info = with_retries(lambda: settings.api().model_info(repo_id, revision=revision), settings, repo_id)
    return [s.rfilename for s in info.siblings or []]


def snapshot_folder(repo_id: str, revision: str, settings: HubSettings) -> Path | None:
    """The cached snapshot of ``repo_id`` at a commit sha (or branch), if the cache holds one."""
    check_repo_id(repo_id)
    check_revision(repo_id, revision)
    repo = repo_folder(repo_id, settings)
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


def resolve_revision(repo_id: str, revision: str, settings: HubSettings) -> str:
    """The commit sha of a branch (online: asks the Hub; offline: the cache's ref)."""
    if is_commit_sha(revision):
        return revision
    check_repo_id(repo_id)
    check_revision(repo_id, revision)
    if settings.offline:
        folder = snapshot_folder(repo_id, revision, settings)
        if folder is None:
            raise FetchError(repo_id, f"offline (HF_HUB_OFFLINE=1) and '{revision}' is not in the cache")
        return folder.name
    try:
        info = with_retries(lambda: settings.api().model_info(repo_id, revision=revision), settings, repo_id)
    except Exception as exc:
        raise FetchError(repo_id, describe_error(exc)) from exc
    if not is_commit_sha(str(info.sha)):
        raise FetchError(repo_id, f"the Hub gave {str(info.sha)[:80]!r} as the commit of '{revision}', not a sha")
    return str(info.sha)


def release(repo_id: str, revision: str, settings: HubSettings) -> int:
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
    repo = repo_folder(repo_id, settings)
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


def _hub_file(repo_id: str, filename: str, revision: str, settings: HubSettings) -> str:
    """One file through huggingface_hub's cache, with the settings' endpoint, token and timeout."""
    return hf_hub_download(
        repo_id,
        filename,
        revision=revision,
        cache_dir=settings.cache_dir,
        endpoint=settings.endpoint,
        token=settings.token,
        etag_timeout=settings.timeout,
    )
