"""The huggingface_hub cache as modelvec keeps it: a repository's folder and its snapshots, files checked against
the sha256 their blobs are named by, the journal of files a killed fetch left unchecked, a cached tree listing that
names blobs outside the cache dropped, and a revision's files released once embedded (only inside the repository's
own folder)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from huggingface_hub import constants

from ..core.errors import CorruptDownload, FetchError, UnsafeHubName
from .client import HubSettings
from .ids import is_commit_sha
from .names import check_repo_id, check_revision

_SHA256 = re.compile(r"[0-9a-f]{64}")


def read_journal(journal: Path) -> set[str] | None:
    """The names a killed fetch had yet to check (empty when none); None when the journal is unreadable (check all)."""
    try:
        names = json.loads(journal.read_text())
    except FileNotFoundError:
        return set()
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else None


def write_journal(journal: Path, names: Sequence[str]) -> None:
    """The journal of :func:`~modelvec.hub.download.fetch` lists ``names`` (deleted when there are none). Best effort: a read-only cache
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
