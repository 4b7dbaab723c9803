"""A local Hugging Face Hub on loopback, for tests and the demo.

The real Hub is unreachable here, so this module serves, from a folder on disk, the part of the Hub HTTP API
that modelvec reaches through ``huggingface_hub`` (model listing with pagination, model info at a revision,
the repository tree that ``snapshot_download`` lists, file resolve with HEAD and byte ranges, the Hub's error
codes), plus fault injection (error statuses, stalls, dropped and reset connections, bodies or headers that do not
match the file, range requests answered with the whole file or another range; each a number of times, or at a seeded
random rate across a whole crawl; repositories deleted mid-run), a bandwidth limit and latency (a
remote Hub's link), a count of the bytes each answer sent, and hostile answers (listings with forged ids, revisions
and file names) for testing clients against a Hub they cannot trust. Point ``HF_ENDPOINT`` (or
``HfApi(endpoint=...)``) at :attr:`HubServer.endpoint`.

Store layout under ``root``::

    <owner>/<name>/repo.json          metadata, refs {"main": sha}, commits {sha: {parent, message, date, files,
                                      card, config}}; written atomically (tmp + os.replace)
    <owner>/<name>/blobs/<sha256>     file contents, content-addressed (hard links to published files if possible)

Only model repos; no uploads over HTTP (publish with :meth:`LocalHub.publish`). Standard library plus PyYAML.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import fnmatch
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import yaml

__all__ = ["HubServer", "LocalHub", "main", "parse_bandwidth"]

CHUNK = 1 << 20  # bytes per read/write when hashing or streaming files
LFS_THRESHOLD = 10 * 1024 * 1024  # files at least this large are reported as LFS files (?blobs=true, tree)
TREE_PAGE_EXPANDED = 50  # the Hub's page size of a tree listing with expand=true (1000 without)
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_META_KEYS = {"author", "created_at", "downloads", "likes", "pipeline_tag", "library_name", "tags", "gated", "private"}
_EXPANDABLE = (
    "author",
    "cardData",
    "config",
    "createdAt",
    "disabled",
    "downloads",
    "gated",
    "lastModified",
    "library_name",
    "likes",
    "pipeline_tag",
    "private",
    "sha",
    "siblings",
    "tags",
    "model-index",
)
_LIST_DEFAULT = (
    "_id",
    "id",
    "modelId",
    "likes",
    "downloads",
    "private",
    "pipeline_tag",
    "library_name",
    "tags",
    "createdAt",
)
_LIST_FULL = ("author", "sha", "lastModified", "gated", "disabled", "siblings")
_INFO_FIELDS = (
    "_id",
    "id",
    "modelId",
    "author",
    "sha",
    "lastModified",
    "createdAt",
    "private",
    "gated",
    "disabled",
    "downloads",
    "likes",
    "library_name",
    "pipeline_tag",
    "tags",
    "cardData",
    "model-index",
    "config",
    "siblings",
)
_SORT_KEYS = {"downloads", "likes", "createdAt", "lastModified"}
_FAULT_KINDS = {
    "status": ("GET", "HEAD"),
    "reset": ("GET",),
    "short": ("GET",),
    "slow": ("GET", "HEAD"),
    "size": ("HEAD",),
    "etag": ("GET", "HEAD"),
    "commit": ("GET", "HEAD"),
    "corrupt": ("GET",),
    "ignore-range": ("GET",),
    "wrong-range": ("GET",),
    "bad-content-range": ("GET",),
}
_RANGE_KINDS = {"ignore-range", "wrong-range", "bad-content-range"}  # taken by GETs with a Range header only
PACE_CHUNK = 64 << 10  # bytes per write (and the token bucket's burst) when a bandwidth is set
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_IGNORED_DIRS = {".git"}  # like upload_folder, also .cache/huggingface (local_dir download metadata)


def _now() -> str:
    return _iso(_dt.datetime.now(_dt.timezone.utc))


def _iso(when: _dt.datetime) -> str:
    """The Hub's date format, ``2024-05-01T12:00:00.000Z`` (UTC, milliseconds)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    when = when.astimezone(_dt.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _normalize_date(value: Any) -> str:
    if isinstance(value, _dt.datetime):
        return _iso(value)
    if isinstance(value, _dt.date):
        return _iso(_dt.datetime(value.year, value.month, value.day, tzinfo=_dt.timezone.utc))
    text = str(value).strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        return _iso(_dt.datetime.fromisoformat(text))
    except ValueError as err:
        raise ValueError(f"created_at must be an ISO date, got {value!r}") from err


def _truthy(values: list[str] | None) -> bool:
    return bool(values) and values[-1] in ("true", "True", "1")


def _relation(files, config: dict, n_bases: int) -> str:
    """The relation the Hub infers when a card names its base without ``base_model_relation``: an adapter by its
    files, a quantization by GGUF files or a quantization config, a merge by several bases, else a fine-tune."""
    if "adapter_config.json" in files:
        return "adapter"
    if any(str(p).endswith(".gguf") for p in files) or "quantization_config" in config:
        return "quantized"
    return "merge" if n_bases > 1 else "finetune"


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value if v is not None and str(v) != ""]
    return [str(value)] if str(value) != "" else []


def _jsonable(value: Any) -> Any:
    """YAML values (dates, sets...) as JSON values."""
    return json.loads(json.dumps(value, default=str))


def parse_front_matter(text: str) -> dict | None:
    """The YAML front matter of a model card (between a leading ``---`` line and the next one), or None."""
    lines = text.lstrip("\ufeff").lstrip("\r\n \t").splitlines()
    if not lines or lines[0].strip() != "---":
        return None
    for end in range(1, len(lines)):
        if lines[end].strip() == "---":
            try:
                data = yaml.safe_load("\n".join(lines[1:end]))
            except yaml.YAMLError:
                return None
            if not isinstance(data, dict):
                return None
            try:
                return _jsonable(data)
            except (TypeError, ValueError):  # e.g. non-string keys YAML allows and JSON does not
                return None
    return None


def _check_repo_id(repo_id: str) -> tuple[str, str]:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(_NAME_RE.match(p) and ".." not in p for p in parts):
        raise ValueError(f"repo_id must be 'owner/name' (letters, digits, '.', '_', '-'), got {repo_id!r}")
    return parts[0], parts[1]


def _check_path(path: str) -> str:
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in path:
        raise ValueError(f"invalid path in repo: {path!r}")
    return path


class LocalHub:
    """Model repos on disk with commits, metadata and fault injection; :meth:`serve` answers the Hub API."""

    def __init__(
        self, root: str | os.PathLike, *, tokens: Iterable[str] = (), page_size: int = 50, tree_page_size: int = 1000
    ) -> None:
        """``root`` holds the repos (persisted); ``tokens`` are the bearer tokens accepted for gated and private
        repos; ``page_size`` is the most items per page of ``/api/models``, ``tree_page_size`` of a repository's
        ``/tree`` (as on the Hub: 1000, and at most 50 with ``expand=true``)."""
        if page_size < 1 or tree_page_size < 1:
            raise ValueError("page_size and tree_page_size must be at least 1")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.tokens = frozenset(tokens)
        self.page_size = int(page_size)
        self.tree_page_size = int(tree_page_size)
        self._lock = threading.RLock()
        self._repos: dict[str, tuple[tuple, dict]] = {}  # repo_id -> (stat key of repo.json, state)
        self._faults: list[dict] = []
        self._truncations: list[dict] = []
        self._deletions: list[dict] = []  # repos to delete once so many more requests have come in
        self._forged: dict[str, dict] = {}
        self._forged_trees: dict[str, dict[str, dict]] = {}  # repo_id -> {path: fields of its tree entry}
        self._refresh()

    # ---------------------------------------------------------------- state on disk

    def _repo_dir(self, repo_id: str) -> Path:
        owner, name = _check_repo_id(repo_id)
        return self.root / owner / name

    @staticmethod
    def _stat_key(path: Path) -> tuple | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _refresh(self) -> None:
        """Reload the repo.json files that changed on disk (another process may publish to the same root)."""
        with self._lock:
            seen = set()
            for owner_dir in self._scandir(self.root):
                for repo_dir in self._scandir(owner_dir):
                    path = repo_dir / "repo.json"
                    key = self._stat_key(path)
                    if key is None:
                        continue
                    repo_id = f"{owner_dir.name}/{repo_dir.name}"
                    seen.add(repo_id)
                    cached = self._repos.get(repo_id)
                    if cached is not None and cached[0] == key:
                        continue
                    try:
                        state = json.loads(path.read_text())
                    except (OSError, ValueError):
                        continue
                    self._repos[repo_id] = (key, state)
            for repo_id in set(self._repos) - seen:
                del self._repos[repo_id]

    @staticmethod
    def _scandir(folder: Path) -> list[Path]:
        try:
            return [Path(e.path) for e in os.scandir(folder) if e.is_dir() and not e.name.startswith(".")]
        except OSError:
            return []

    def _write_state(self, repo_id: str, state: dict) -> None:
        folder = self._repo_dir(repo_id)
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".repo.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(state, f, indent=1, sort_keys=True)
            os.replace(tmp, folder / "repo.json")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._repos[repo_id] = (self._stat_key(folder / "repo.json"), state)

    def _state(self, repo_id: str) -> dict | None:
        """One repo's state, reloaded when its repo.json changed on disk (only that file is looked at: a Hub of
        thousands of repos answers a file request without scanning them all)."""
        with self._lock:
            try:
                path = self._repo_dir(repo_id) / "repo.json"
            except ValueError:
                return None
            key = self._stat_key(path)
            cached = self._repos.get(repo_id)
            if key is None:
                self._repos.pop(repo_id, None)
                return None
            if cached is None or cached[0] != key:
                try:
                    cached = (key, json.loads(path.read_text()))
                except (OSError, ValueError):
                    return cached[1] if cached else None
                self._repos[repo_id] = cached
            return cached[1]

    def repos(self) -> list[str]:
        """The ids of all repos, sorted."""
        with self._lock:
            self._refresh()
            return sorted(self._repos)

    # ---------------------------------------------------------------- publishing

    def _store_blob(self, blobs: Path, source: bytes | Path, link: bool = False) -> dict:
        """Put content into the blob store; its {sha256, size, blob_id}."""
        blobs.mkdir(parents=True, exist_ok=True)
        sha256 = hashlib.sha256()
        if isinstance(source, bytes):
            size = len(source)
            sha256.update(source)
            blob_sha1 = hashlib.sha1(b"blob %d\0" % size + source).hexdigest()
        else:
            size = source.stat().st_size
            git = hashlib.sha1(b"blob %d\0" % size)
            with open(source, "rb") as f:
                while chunk := f.read(CHUNK):
                    sha256.update(chunk)
                    git.update(chunk)
            blob_sha1 = git.hexdigest()
        digest = sha256.hexdigest()
        target = blobs / digest
        if not target.exists():
            tmp = blobs / f".{digest}.{os.getpid()}.{threading.get_ident()}.tmp"
            tmp.unlink(missing_ok=True)
            try:
                if isinstance(source, bytes):
                    tmp.write_bytes(source)
                elif link:
                    try:
                        os.link(source, tmp)
                    except OSError:
                        shutil.copyfile(source, tmp)
                else:
                    shutil.copyfile(source, tmp)
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
        return {"sha256": digest, "size": size, "blob_id": blob_sha1}

    @staticmethod
    def _collect(
        files: Mapping[str, bytes | str | os.PathLike] | str | os.PathLike, unsafe_paths: bool = False
    ) -> dict[str, bytes | Path]:
        if isinstance(files, (str, os.PathLike)):
            folder = Path(files)
            if not folder.is_dir():
                raise NotADirectoryError(f"not a folder: {folder}")
            out: dict[str, bytes | Path] = {}
            for dirpath, dirnames, filenames in os.walk(folder):
                rel_dir = Path(dirpath).relative_to(folder)
                dirnames[:] = sorted(
                    d for d in dirnames if d not in _IGNORED_DIRS and (rel_dir / d).as_posix() != ".cache/huggingface"
                )
                for fname in filenames:
                    full = Path(dirpath) / fname
                    if full.is_file():
                        out[(rel_dir / fname).as_posix()] = full
            return out
        out = {}
        for path, content in files.items():
            if not unsafe_paths:
                _check_path(path)
            elif not isinstance(path, str) or not path:
                raise ValueError(f"invalid path in repo: {path!r}")
            if isinstance(content, (bytes, bytearray, memoryview)):
                out[path] = bytes(content)
            elif isinstance(content, (str, os.PathLike)):
                source = Path(content)
                if not source.is_file():
                    raise FileNotFoundError(f"{path}: no such local file {source} (pass file contents as bytes)")
                out[path] = source
            else:
                raise TypeError(f"{path}: content must be bytes or a local file path, not {type(content).__name__}")
        return out

    def _check_meta(self, meta: dict) -> dict:
        unknown = set(meta) - _META_KEYS
        if unknown:
            raise TypeError(f"unknown metadata: {sorted(unknown)}; known: {sorted(_META_KEYS)}")
        meta = dict(meta)
        if "gated" in meta and meta["gated"] not in (False, "auto", "manual"):
            raise ValueError("gated must be False, 'auto' or 'manual'")
        if "created_at" in meta:
            meta["created_at"] = _normalize_date(meta["created_at"])
        if "tags" in meta:
            meta["tags"] = _as_list(meta["tags"])
        for key in ("downloads", "likes"):
            if key in meta:
                meta[key] = int(meta[key])
        if "private" in meta:
            meta["private"] = bool(meta["private"])
        return meta

    def publish(
        self,
        repo_id: str,
        files: Mapping[str, bytes | str | os.PathLike] | str | os.PathLike,
        *,
        message: str = "",
        link: bool = False,
        unsafe_paths: bool = False,
        **meta: Any,
    ) -> str:
        """Make a new commit whose tree is exactly ``files`` and move ``main`` to it; the 40-hex commit sha.

        ``files`` is a folder (every regular file under it, except ``.git/`` and ``.cache/huggingface/``) or a
        mapping path-in-repo -> bytes or local file path. Local files are copied, or with ``link=True``
        hard-linked when possible (saves the disk for large demo weights; the source must then never be
        rewritten in place). ``meta``: author, created_at, downloads, likes, pipeline_tag, library_name, tags,
        gated (False/"auto"/"manual"), private.

        ``unsafe_paths=True`` accepts any non-empty path in a mapping (``../../x``, ``/abs``, ``a\\b``, NUL, very long
        names), as a hostile uploader could try: the server stores contents by hash and names only in ``repo.json``,
        so such names are listed and served but never touch the server's disk.
        """
        owner, _ = _check_repo_id(repo_id)
        meta = self._check_meta(meta)
        collected = self._collect(files, unsafe_paths)
        blobs = self._repo_dir(repo_id) / "blobs"
        tree = {path: self._store_blob(blobs, source, link) for path, source in sorted(collected.items())}
        card = config = None
        if "README.md" in tree:
            text = (blobs / tree["README.md"]["sha256"]).read_bytes().decode("utf-8", errors="replace")
            card = parse_front_matter(text)
        if "config.json" in tree:
            try:
                raw = json.loads((blobs / tree["config.json"]["sha256"]).read_bytes())
            except ValueError:
                raw = None
            if isinstance(raw, dict):
                config = {k: raw[k] for k in ("model_type", "architectures") if k in raw}
        with self._lock:
            current = self._state(repo_id)
            state = (
                json.loads(json.dumps(current))
                if current is not None
                else {
                    "id": repo_id,
                    "meta": {
                        "author": owner,
                        "created_at": _now(),
                        "downloads": 0,
                        "likes": 0,
                        "library_name": None,
                        "pipeline_tag": None,
                        "tags": [],
                        "gated": False,
                        "private": False,
                    },
                    "refs": {},
                    "commits": {},
                }
            )
            parent = state["refs"].get("main")
            h = hashlib.sha1()
            h.update((parent or "").encode())
            for path in sorted(tree):
                h.update(b"\0" + path.encode() + b"\0" + tree[path]["sha256"].encode())
            h.update(b"\0" + message.encode())
            sha = h.hexdigest()
            state["commits"][sha] = {
                "parent": parent,
                "message": message,
                "date": _now(),
                "files": tree,
                "card": card,
                "config": config,
            }
            state["refs"]["main"] = sha
            state["meta"].update(meta)
            self._write_state(repo_id, state)
        return sha

    def set_meta(self, repo_id: str, **meta: Any) -> None:
        """Update a repo's metadata (same keys as :meth:`publish`) without a new commit."""
        meta = self._check_meta(meta)
        with self._lock:
            current = self._state(repo_id)
            if current is None:
                raise KeyError(f"no repo {repo_id!r} in {self.root}")
            state = json.loads(json.dumps(current))
            state["meta"].update(meta)
            self._write_state(repo_id, state)

    # ---------------------------------------------------------------- fault injection

    def fail(
        self,
        pattern: str,
        *,
        status: int | None = None,
        times: int | None,
        methods: Iterable[str] | None = None,
        retry_after: float | None = None,
        kind: str = "status",
        after_bytes: int = 0,
        delay: float = 0.0,
        value: Any = None,
        rate: float | None = None,
        seed: int | None = None,
    ) -> None:
        """The next ``times`` requests (None: every one) whose URL path (unquoted) matches the fnmatch ``pattern``
        and whose method is in ``methods`` go wrong the way ``kind`` says (with ``rate``, each such request only
        with that probability, drawn from a generator seeded by ``seed``: a fault rate across a whole crawl):

        ``status``   answer ``status`` with a JSON error body (and ``Retry-After`` when given);
        ``reset``    send ``after_bytes`` bytes of the body, then abort the connection with a TCP reset (RST);
                     with ``after_bytes=0`` the request is reset before any answer;
        ``short``    send ``after_bytes`` bytes of the body, then close the connection cleanly (FIN) although
                     ``Content-Length`` announced more (like :meth:`truncate`);
        ``slow``     stall ``delay`` seconds before answering (``after_bytes=0``) or after ``after_bytes`` bytes of
                     the body, then go on (a client that timed out meanwhile just sees a dead connection);
        ``size``     a HEAD of a file announces ``Content-Length`` of the file's size + ``value`` (default 1);
        ``etag``     answers about a file carry ``ETag: value`` (the raw header value) instead of its sha256;
        ``commit``   answers about a file (200 or 404) carry ``X-Repo-Commit: value``;
        ``corrupt``  a file's body has the byte at offset ``after_bytes`` of the file inverted (same length, same
                     headers); a range answer carries it inverted when its range covers that offset.

        ``reset``, ``short`` and ``slow`` count ``after_bytes`` from the first byte of the body, also in a 206 answer
        to a range request (the body then starts at the range's first byte).

        The range kinds are taken only by a GET with a ``Range`` header (a GET without one leaves the rule for the
        next):

        ``ignore-range``       answer 200 with the whole file and no ``Content-Range``, as a server that ignores
                               ``Range`` does;
        ``wrong-range``        answer 206 with ``Content-Range`` naming the range asked for but the body of the range
                               shifted by ``value`` bytes (default 1; same length, kept inside the file): a lying server
                               that no header gives away;
        ``bad-content-range``  answer 206 with the bytes asked for but a ``Content-Range`` naming the range shifted by
                               ``value`` bytes (default 1): detectable by a client that checks it.

        ``methods`` defaults to GET and HEAD, but GET only for the body kinds (reset, short, corrupt, the range kinds,
        and slow with ``after_bytes``) and HEAD only for ``size``. Rules are tried in the order given; a request
        consumes the first rule that matches it.
        """
        if kind not in _FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {sorted(_FAULT_KINDS)}")
        if kind == "status" and status is None:
            raise ValueError("kind='status' needs a status")
        if kind in ("etag", "commit") and not isinstance(value, str):
            raise ValueError(f"kind={kind!r} needs value= (the header's value)")
        if rate is not None and not 0.0 < float(rate) <= 1.0:
            raise ValueError(f"rate must be a probability in (0, 1], not {rate!r}")
        if methods is None:
            methods = ("GET",) if kind == "slow" and after_bytes > 0 else _FAULT_KINDS[kind]
        with self._lock:
            self._faults.append(
                {
                    "pattern": pattern,
                    "kind": kind,
                    "status": None if status is None else int(status),
                    "left": None if times is None else int(times),
                    "methods": {m.upper() for m in methods},
                    "retry_after": retry_after,
                    "after_bytes": max(0, int(after_bytes)),
                    "delay": float(delay),
                    "value": (1 if value is None else int(value))
                    if kind in ("size", "wrong-range", "bad-content-range")
                    else value,
                    "rate": None if rate is None else float(rate),
                    "rng": None if rate is None else random.Random(seed),
                }
            )

    def forge(self, repo_id: str, **fields: Any) -> None:
        """Make listings and model info lie about ``repo_id``: each given field replaces what the Hub would say.

        ``id`` (also ``modelId``), ``sha``, ``siblings`` (a list of file names), or any other field of the
        answers. A forged ``sha`` is also accepted as a revision of the repo (it resolves to ``main``), as a hostile
        Hub would, so a client that trusts it reaches the download. ``tree`` ({path: {field: value}}) makes the
        tree listing lie instead: each path's fields replace those of its entry (``lfs``, ``xetHash``, ``size``...),
        or make a file entry of a path the commit does not have. :meth:`clear_faults` drops every forgery.
        """
        self._repo_dir(repo_id)  # a valid id of a repo on disk
        forged = dict(fields)
        tree = forged.pop("tree", None)
        if "id" in forged:
            forged.setdefault("modelId", forged["id"])
        if "siblings" in forged:
            forged["siblings"] = [{"rfilename": str(name)} for name in forged["siblings"]]
        with self._lock:
            self._forged[repo_id] = forged
            if tree is not None:
                self._forged_trees[repo_id] = json.loads(json.dumps(tree))

    def truncate(self, pattern: str, *, keep: int, times: int | None = None) -> None:
        """GET bodies of matching resolve paths stop after ``keep`` bytes and the connection is closed, while
        Content-Length declares the full length; for the next ``times`` GETs (None: always)."""
        with self._lock:
            self._truncations.append({"pattern": pattern, "keep": int(keep), "left": times})

    def clear_faults(self) -> None:
        """Drop every pending :meth:`fail` and :meth:`truncate` rule, every :meth:`forge` and every :meth:`delete`
        still waiting for its requests."""
        with self._lock:
            self._faults.clear()
            self._truncations.clear()
            self._deletions.clear()
            self._forged.clear()
            self._forged_trees.clear()

    def _take_fault(self, method: str, path: str, ranged: bool = False) -> dict | None:
        with self._lock:
            for rule in self._faults:
                if (
                    (rule["left"] is None or rule["left"] > 0)
                    and method in rule["methods"]
                    and (ranged or rule["kind"] not in _RANGE_KINDS)
                    and fnmatch.fnmatchcase(path, rule["pattern"])
                    and (rule["rate"] is None or rule["rng"].random() < rule["rate"])
                ):
                    if rule["left"] is not None:
                        rule["left"] -= 1
                    return dict(rule)
            return None

    def delete(self, repo_id: str, *, after: int = 0, pattern: str = "*") -> None:
        """Delete ``repo_id`` as its owner would on the Hub: from then on every answer about it is 404 and listings
        leave it out. ``after`` > 0 deletes it when the ``after``-th request (from now) whose URL path matches the
        fnmatch ``pattern`` comes in, before that request is answered: a repository deleted in the middle of a run.
        The files go from disk; publishing the same files again gives the same commit sha."""
        self._repo_dir(repo_id)  # a valid id
        with self._lock:
            if after <= 0:
                self._remove(repo_id)
            else:
                self._deletions.append({"repo": repo_id, "pattern": pattern, "left": int(after)})

    def _remove(self, repo_id: str) -> None:
        with self._lock:
            shutil.rmtree(self._repo_dir(repo_id), ignore_errors=True)
            self._repos.pop(repo_id, None)

    def _count_request(self, path: str) -> None:
        """A request came in: the deletions waiting for it count it, and those whose count is reached happen."""
        with self._lock:
            if not self._deletions:
                return
            for rule in list(self._deletions):
                if fnmatch.fnmatchcase(path, rule["pattern"]):
                    rule["left"] -= 1
                    if rule["left"] <= 0:
                        self._deletions.remove(rule)
                        self._remove(rule["repo"])

    def _unforge(self, repo_id: str, revision: str) -> str:
        """A forged sha of ``repo_id`` names its ``main``."""
        with self._lock:
            forged = self._forged.get(repo_id, {})
        return "main" if "sha" in forged and revision == forged["sha"] else revision

    def _take_truncation(self, path: str) -> int | None:
        with self._lock:
            for rule in self._truncations:
                if (rule["left"] is None or rule["left"] > 0) and fnmatch.fnmatchcase(path, rule["pattern"]):
                    if rule["left"] is not None:
                        rule["left"] -= 1
                    return rule["keep"]
            return None

    # ---------------------------------------------------------------- views

    def _tags(self, state: dict, commit: dict) -> list[str]:
        meta, card = state["meta"], commit.get("card") or {}
        files = commit["files"]
        tags: list[str] = []
        tags += _as_list(self._library_name(state, commit))
        if any(p.endswith(".safetensors") for p in files):
            tags.append("safetensors")
        if any(p.endswith(".bin") for p in files):
            tags.append("pytorch")
        tags += _as_list((commit.get("config") or {}).get("model_type"))
        tags += _as_list(self._pipeline_tag(state, commit))
        tags += [f"dataset:{d}" for d in _as_list(card.get("datasets"))]
        bases = _as_list(card.get("base_model"))
        relation = str(card.get("base_model_relation") or _relation(files, commit.get("config") or {}, len(bases)))
        for base in bases:
            tags += [f"base_model:{base}", f"base_model:{relation}:{base}"]
        tags += [f"license:{lic}" for lic in _as_list(card.get("license"))]
        tags += _as_list(card.get("language"))
        tags += _as_list(card.get("tags"))
        tags += _as_list(meta.get("tags"))
        return list(dict.fromkeys(tags))

    @staticmethod
    def _library_name(state: dict, commit: dict) -> str:
        card = commit.get("card") or {}
        return state["meta"].get("library_name") or card.get("library_name") or "transformers"

    @staticmethod
    def _pipeline_tag(state: dict, commit: dict) -> str | None:
        card = commit.get("card") or {}
        return state["meta"].get("pipeline_tag") or card.get("pipeline_tag") or None

    def _fields(self, state: dict, sha: str, *, blobs: bool = False) -> dict:
        """Every property of the repo at commit ``sha`` (tags and counters from main), as the Hub names them."""
        main = state["commits"][state["refs"]["main"]]
        commit = state["commits"][sha]
        meta, repo_id = state["meta"], state["id"]
        siblings = []
        for path, info in sorted(commit["files"].items()):
            sib: dict[str, Any] = {"rfilename": path}
            if blobs:
                sib["size"] = info["size"]
                sib["blobId"] = info["blob_id"]
                if info["size"] >= LFS_THRESHOLD:
                    sib["lfs"] = {"size": info["size"], "sha256": info["sha256"], "pointerSize": 134}
            siblings.append(sib)
        fields: dict[str, Any] = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": meta.get("author") or repo_id.split("/")[0],
            "sha": sha,
            "lastModified": commit["date"],
            "createdAt": meta["created_at"],
            "private": bool(meta.get("private")),
            "gated": meta.get("gated") or False,
            "disabled": False,
            "downloads": int(meta.get("downloads") or 0),
            "likes": int(meta.get("likes") or 0),
            "library_name": self._library_name(state, main),
            "pipeline_tag": self._pipeline_tag(state, main),
            "tags": self._tags(state, main),
            "siblings": siblings,
        }
        if commit.get("card") is not None:
            fields["cardData"] = commit["card"]
            if commit["card"].get("model-index") is not None:
                fields["model-index"] = commit["card"]["model-index"]
        if commit.get("config") is not None:
            fields["config"] = commit["config"]
        if fields["pipeline_tag"] is None:
            del fields["pipeline_tag"]
        with self._lock:
            fields.update(json.loads(json.dumps(self._forged.get(repo_id, {}))))
        return fields

    def _tree(self, state: dict, sha: str, path: str, recursive: bool, expand: bool) -> list[dict] | None:
        """The entries of ``GET /api/models/{repo}/tree/{revision}/{path}`` at commit ``sha`` as the Hub gives them
        (folders and files in tree order; each file's git blob id, size, and ``lfs`` sha256 when it is at least
        LFS_THRESHOLD bytes, like ``?blobs=true``), or None when ``path`` is no folder of that commit. The children of
        ``path``, or with ``recursive`` everything under it; ``expand`` adds each entry's ``lastCommit``."""
        files = state["commits"][sha]["files"]
        folders: dict[str, list[str]] = {}  # folder -> the files under it, at any depth
        for name in files:
            parts = name.split("/")
            for i in range(1, len(parts)):
                folder = "/".join(parts[:i])
                if folder:  # an absolute name (published with unsafe_paths) has no folder ""
                    folders.setdefault(folder, []).append(name)
        if path and path not in folders:
            return None
        prefix = f"{path}/" if path else ""
        entries = [(p, "directory") for p in folders] + [(p, "file") for p in files]
        entries = [
            (p, kind) for p, kind in entries if p.startswith(prefix) and (recursive or "/" not in p[len(prefix) :])
        ]
        out = []
        for p, kind in sorted(entries, key=lambda e: (e[0].split("/"), e[1])):
            if kind == "file":
                info = files[p]
                entry: dict[str, Any] = {"type": "file", "oid": info["blob_id"], "size": info["size"], "path": p}
                if info["size"] >= LFS_THRESHOLD:
                    entry["lfs"] = {"oid": info["sha256"], "size": info["size"], "pointerSize": 134}
            else:
                h = hashlib.sha1()
                for name in sorted(folders[p]):
                    h.update(name.encode("utf-8", "surrogatepass") + b"\0" + files[name]["sha256"].encode() + b"\0")
                entry = {"type": "directory", "oid": h.hexdigest(), "size": 0, "path": p}
            if expand:
                entry["lastCommit"] = self._last_commit(state, sha, p)
            out.append(entry)
        with self._lock:
            forged = json.loads(json.dumps(self._forged_trees.get(state["id"], {})))
        for entry in out:
            entry.update(forged.pop(entry["path"], {}) if entry["type"] == "file" else {})
        out += [
            {"type": "file", "oid": "0" * 40, "size": 0, "path": p, **fields} for p, fields in sorted(forged.items())
        ]
        return out

    @staticmethod
    def _last_commit(state: dict, sha: str, path: str) -> dict:
        """The last commit up to ``sha`` that changed the file or folder ``path``, as the tree's ``lastCommit``."""

        def content(commit: dict) -> dict:
            return {n: i["sha256"] for n, i in commit["files"].items() if n == path or n.startswith(path + "/")}

        here = content(state["commits"][sha])
        while True:
            parent = state["commits"][sha].get("parent")
            if not parent or parent not in state["commits"] or content(state["commits"][parent]) != here:
                break
            sha = parent
        commit = state["commits"][sha]
        return {"id": sha, "title": (commit.get("message") or "").split("\n", 1)[0], "date": commit["date"]}

    def serve(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        bandwidth: float | str | None = None,
        latency: float = 0.0,
    ) -> HubServer:
        """Start serving in a daemon thread; the running :class:`HubServer` (a context manager).

        ``bandwidth`` (bytes per second, or text such as ``100mbit``; None: unlimited) is the link all answers
        share; ``latency`` (seconds) is the time before each answer starts (see :class:`HubServer`)."""
        return HubServer(self, host, port, bandwidth=bandwidth, latency=latency)


# -------------------------------------------------------------------- HTTP


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # keep-alive connections of a pooled client must not block stop()

    def __init__(self, address, handler, hub: LocalHub, owner: HubServer) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.hub = hub
        self.owner = owner
        self.connections: set[socket.socket] = set()
        self.conn_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        with self.conn_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self.conn_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # a client that hung up (as a range reader does on a whole file it did not want) is no error
        super().handle_error(request, client_address)


class _HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "LocalHub/1"
    timeout = 300  # idle keep-alive connections close after this many seconds
    server: _Server
    # defaults for answers sent before _dispatch ran (malformed request line, unknown method)
    _path, _raw_path, _query, _token, _valid, _answered = "", "", {}, None, False, False
    _fault: dict | None = None
    _record: dict | None = None

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def _other(self) -> None:
        self.close_connection = True  # a body we do not read may follow
        self._dispatch(self.command)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _other

    # ------------------------------------------------------------ plumbing

    def send_response(self, code: int, message: str | None = None) -> None:
        # log before anything reaches the wire, so a client that got the answer also finds it in the log
        self._answered = True
        self._log(code)
        super().send_response(code, message)

    def _log(self, code: int | None) -> None:
        record = {
            "method": self.command,
            "path": self._path,
            "query": self._query,
            "status": code,
            "range": self.headers.get("Range"),
            "auth": self._token is not None,
            "fault": self._fault["kind"] if self._fault else None,
            "time": time.monotonic(),
            "bytes": 0,
        }
        self._record = record
        with self.server.owner._lock:
            self.server.owner.requests.append(record)

    def _reset(self) -> None:
        """Abort the connection with a TCP reset (RST), as a dropped link or a crashed proxy does."""
        try:
            self.wfile.flush()
            time.sleep(0.05)  # let the client read what was sent: a reset discards the peer's unread data
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.rfile.close()  # the socket's file closes only once its makefile() readers are closed too
            self.connection.close()
        except OSError:
            pass
        self.close_connection = True

    def _emit(self, data: bytes) -> None:
        """Write body bytes: paced by the server's bandwidth (in pieces of at most PACE_CHUNK bytes then) and
        counted in the request's record. A piece is counted just before it is written (so a client that got the
        whole answer finds it counted) and uncounted if the write fails."""
        bucket = self.server.owner._bucket
        step = PACE_CHUNK if bucket is not None else max(len(data), 1)
        view = memoryview(data)
        for at in range(0, len(data), step):
            piece = view[at : at + step]
            if bucket is not None:
                bucket.take(len(piece))
            self._count(len(piece))
            try:
                self.wfile.write(piece)
            except BaseException:
                self._count(-len(piece))
                raise

    def _count(self, n: int) -> None:
        if self._record is not None:
            with self.server.owner._lock:
                self._record["bytes"] += n

    def _write_body(self, chunks: Iterable[bytes], offset: int = 0) -> None:
        """Send a body (whose first byte is byte ``offset`` of the file), applying a body fault if one is active."""
        fault = self._fault if self._fault and self._fault["kind"] in ("reset", "short", "slow", "corrupt") else None
        at = fault["after_bytes"] if fault else -1
        sent = 0
        for chunk in chunks:
            if fault and fault["kind"] == "corrupt" and offset + sent <= at < offset + sent + len(chunk):
                i = at - offset - sent
                chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1 :]
            if fault and fault["kind"] in ("reset", "short", "slow") and sent <= at < sent + len(chunk) and at > 0:
                head = at - sent
                self._emit(chunk[:head])
                sent += head
                chunk = chunk[head:]
                if fault["kind"] == "slow":
                    self.wfile.flush()
                    time.sleep(fault["delay"])
                    fault = None
                else:
                    if fault["kind"] == "reset":
                        self._reset()
                    else:
                        self.close_connection = True
                        self.wfile.flush()
                    return
            self._emit(chunk)
            sent += len(chunk)

    def _send_json(self, status: int, payload: Any, headers: dict | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self._fault and self._fault["kind"] in ("reset", "short") and self.command != "HEAD":
            self.close_connection = True
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self._write_body([body])

    def _send_error(self, err: _HubError) -> None:
        headers = dict(err.headers)
        if self._fault and self._fault["kind"] == "commit" and "X-Repo-Commit" in headers:
            headers["X-Repo-Commit"] = self._fault["value"]
        if err.code:
            headers["X-Error-Code"] = err.code
        headers["X-Error-Message"] = err.message
        self._send_json(err.status, {"error": err.message}, headers)

    def _dispatch(self, method: str) -> None:
        self._answered = False
        self._fault = None
        self._record = None
        if self.server.owner.latency > 0:
            time.sleep(self.server.owner.latency)
        split = urlsplit(self.path)
        self._raw_path = split.path
        self._path = unquote(split.path)
        self._query = parse_qs(split.query, keep_blank_values=True)
        auth = self.headers.get("Authorization") or ""
        self._token = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        hub = self.server.hub
        self._valid = self._token is not None and self._token in hub.tokens
        try:
            hub._count_request(self._path)
            fault = hub._take_fault(method, self._path, ranged=bool(self.headers.get("Range")))
            if fault is not None and fault["kind"] == "status":
                headers = {}
                if fault["retry_after"] is not None:
                    ra = fault["retry_after"]
                    headers["Retry-After"] = str(int(ra)) if float(ra).is_integer() else str(ra)
                self._fault = fault
                self._send_json(fault["status"], {"error": f"injected failure {fault['status']}"}, headers)
                return
            self._fault = fault
            if fault is not None and fault["after_bytes"] == 0 and fault["kind"] in ("reset", "slow"):
                if fault["kind"] == "slow":
                    time.sleep(fault["delay"])
                else:
                    self._log(None)  # no answer: logged as status None
                    self._reset()
                    return
            if method not in ("GET", "HEAD"):
                raise _HubError(404, None, "Not Found")
            segments = self._raw_path.split("/")[1:]
            if segments[:2] == ["api", "models"] and len(segments) <= 3 and (len(segments) == 2 or not segments[2]):
                self._list_models()
            elif segments[:2] == ["api", "models"] and len(segments) == 4:
                self._model_info(f"{unquote(segments[2])}/{unquote(segments[3])}", "main")
            elif segments[:2] == ["api", "models"] and len(segments) == 6 and segments[4] == "revision":
                self._model_info(f"{unquote(segments[2])}/{unquote(segments[3])}", unquote(segments[5]))
            elif segments[:2] == ["api", "models"] and len(segments) >= 6 and segments[4] == "tree":
                self._list_tree(
                    f"{unquote(segments[2])}/{unquote(segments[3])}",
                    unquote(segments[5]),
                    unquote("/".join(segments[6:])),
                )
            elif len(segments) >= 5 and segments[2] == "resolve":
                repo_id = f"{unquote(segments[0])}/{unquote(segments[1])}"
                self._resolve(method, repo_id, unquote(segments[3]), unquote("/".join(segments[4:])))
            else:
                raise _HubError(404, None, "Not Found")
        except _HubError as err:
            self._send_error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as err:  # a bug or a damaged store: answer 500 rather than drop the connection
            self.close_connection = True
            if not self._answered:
                self._send_json(500, {"error": f"{type(err).__name__}: {err}"})

    # ------------------------------------------------------------ lookups

    def _repo(self, repo_id: str) -> dict:
        state = self.server.hub._state(repo_id)
        if state is None or not state["refs"].get("main") or (state["meta"].get("private") and not self._valid):
            raise _HubError(404, "RepoNotFound", "Repository not found")
        return state

    @staticmethod
    def _commit_sha(state: dict, revision: str) -> str:
        if revision in state["refs"]:
            return state["refs"][revision]
        if _SHA_RE.match(revision) and revision in state["commits"]:
            return revision
        raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    def _expand(self) -> list[str] | None:
        values = self._query.get("expand", []) + self._query.get("expand[]", [])
        if not values:
            return None
        props = [p.strip() for v in values for p in v.split(",") if p.strip()]
        return [p for p in _EXPANDABLE if p in props]

    # ------------------------------------------------------------ endpoints

    def _list_models(self) -> None:
        hub, q = self.server.hub, self._query
        filters = [f.lower() for f in q.get("filter", []) if f]
        search = (q.get("search") or [""])[-1].lower()
        author = (q.get("author") or [""])[-1].lower()
        sort = (q.get("sort") or ["downloads"])[-1]
        sort = sort if sort in _SORT_KEYS else "downloads"
        try:
            direction = int((q.get("direction") or ["-1"])[-1])
        except ValueError:
            direction = -1
        try:
            limit = int(q["limit"][-1]) if q.get("limit") else None
            cursor = max(0, int(q["cursor"][-1])) if q.get("cursor") else 0
        except ValueError:
            raise _HubError(400, None, "limit and cursor must be integers") from None

        with hub._lock:
            hub._refresh()
            states = [s for _, s in hub._repos.values()]
        items = []
        for state in states:
            if not state["refs"].get("main") or (state["meta"].get("private") and not self._valid):
                continue
            fields = hub._fields(state, state["refs"]["main"])
            if search and search not in state["id"].lower():
                continue
            if author and author != str(fields["author"]).lower():
                continue
            tags = {t.lower() for t in fields["tags"]}
            if any(f not in tags for f in filters):
                continue
            items.append(fields)
        items.sort(key=lambda f: f["id"])
        items.sort(key=lambda f: f[sort], reverse=direction < 0)
        total = len(items) if limit is None else min(len(items), max(limit, 0))
        page = items[cursor : min(cursor + hub.page_size, total)]

        expand = self._expand()
        if expand is not None:
            keys = ["_id", "id", *expand]
        else:
            keys = list(_LIST_DEFAULT)
            if _truthy(q.get("full")):
                keys += _LIST_FULL
            if _truthy(q.get("cardData")):
                keys.append("cardData")
            if _truthy(q.get("config")):
                keys.append("config")
        out = []
        for fields in page:
            item = {k: fields[k] for k in keys if k in fields}
            if "siblings" in item:
                item["siblings"] = [{"rfilename": s["rfilename"]} for s in item["siblings"]]
            out.append(item)

        headers = {}
        end = cursor + len(page)
        if end < total:
            params = [(k, v) for k, vs in q.items() if k != "cursor" for v in vs] + [("cursor", str(end))]
            host = self.headers.get("Host") or self.server.owner.endpoint.split("://", 1)[1]
            headers["Link"] = f'<http://{host}/api/models?{urlencode(params)}>; rel="next"'
        self._send_json(200, out, headers)

    def _model_info(self, repo_id: str, revision: str) -> None:
        state = self._repo(repo_id)
        sha = self._commit_sha(state, self.server.hub._unforge(repo_id, revision))
        fields = self.server.hub._fields(state, sha, blobs=_truthy(self._query.get("blobs")))
        expand = self._expand()
        keys = ["_id", "id", *expand] if expand is not None else list(_INFO_FIELDS)
        self._send_json(200, {k: fields[k] for k in keys if k in fields})

    def _list_tree(self, repo_id: str, revision: str, path: str) -> None:
        """``GET /api/models/{repo}/tree/{revision}[/{path}]?recursive=&expand=&cursor=``, paged with a Link header
        as the Hub does. Like model info it is public for a gated repo (only files are gated)."""
        hub, q = self.server.hub, self._query
        state = self._repo(repo_id)
        sha = self._commit_sha(state, hub._unforge(repo_id, revision))
        expand = _truthy(q.get("expand"))
        entries = hub._tree(state, sha, path.strip("/"), _truthy(q.get("recursive")), expand)
        if entries is None:
            raise _HubError(404, "EntryNotFound", f'{path} does not exist on "{revision}"', {"X-Repo-Commit": sha})
        try:
            cursor = max(0, int(q["cursor"][-1])) if q.get("cursor") else 0
        except ValueError:
            raise _HubError(400, None, "cursor must be an integer") from None
        size = min(hub.tree_page_size, TREE_PAGE_EXPANDED) if expand else hub.tree_page_size
        page = entries[cursor : cursor + size]
        headers = {}
        if cursor + len(page) < len(entries):
            params = [(k, v) for k, vs in q.items() if k != "cursor" for v in vs] + [("cursor", str(cursor + size))]
            host = self.headers.get("Host") or self.server.owner.endpoint.split("://", 1)[1]
            headers["Link"] = f'<http://{host}{self._raw_path}?{urlencode(params)}>; rel="next"'
        self._send_json(200, page, headers)

    def _resolve(self, method: str, repo_id: str, revision: str, path: str) -> None:
        hub = self.server.hub
        state = self._repo(repo_id)
        if state["meta"].get("gated") and not self._valid:
            raise _HubError(
                401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to "
                "it and be authenticated to access it. Please log in.",
            )
        sha = self._commit_sha(state, hub._unforge(repo_id, revision))
        info = state["commits"][sha]["files"].get(path)
        if info is None:
            raise _HubError(404, "EntryNotFound", f"Entry not found: {path}", {"X-Repo-Commit": sha})
        blob = hub._repo_dir(repo_id) / "blobs" / info["sha256"]
        size = info["size"]
        common = {
            "X-Repo-Commit": sha,
            "ETag": f'"{info["sha256"]}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }

        fault = self._fault
        start, end, status = 0, size - 1, 200
        if method == "GET" and self.headers.get("Range") and not (fault and fault["kind"] == "ignore-range"):
            parsed = self._parse_range(self.headers["Range"], size)
            if parsed == "unsatisfiable":
                self._send_json(
                    416,
                    {"error": "Requested range not satisfiable"},
                    {**{k: v for k, v in common.items() if k != "Content-Type"}, "Content-Range": f"bytes */{size}"},
                )
                return
            if parsed is not None:
                start, end = parsed
                status = 206
        length = end - start + 1 if size else 0
        keep = hub._take_truncation(self._path) if method == "GET" else None
        if fault and fault["kind"] == "short" and (keep is None or fault["after_bytes"] < keep):
            keep = fault["after_bytes"]
        announced = length
        if fault and fault["kind"] == "size" and method == "HEAD":
            announced = max(0, length + fault["value"])
        if fault and fault["kind"] == "etag":
            common["ETag"] = fault["value"]
        if fault and fault["kind"] == "commit":
            common["X-Repo-Commit"] = fault["value"]

        self.send_response(status)
        for key, value in common.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(announced))
        source = start  # where in the file the body comes from
        if status == 206 and fault and fault["kind"] == "wrong-range":
            source = min(max(0, start + fault["value"]), size - length)
        if status == 206:
            shift = fault["value"] if fault and fault["kind"] == "bad-content-range" else 0
            self.send_header("Content-Range", f"bytes {start + shift}-{end + shift}/{size}")
        if keep is not None and keep < length:
            self.close_connection = True
        self.end_headers()
        if method == "HEAD" or length == 0:
            return
        self._write_body(self._chunks(blob, source, length if keep is None else min(length, max(keep, 0))), source)
        if self.close_connection:
            self.wfile.flush()

    def _chunks(self, blob: Path, source: int, remaining: int) -> Iterable[bytes]:
        """``remaining`` bytes of ``blob`` from byte ``source``, a read at a time."""
        with open(blob, "rb") as f:
            f.seek(source)
            while remaining > 0:
                chunk = f.read(min(CHUNK, remaining))
                if not chunk:  # blob shorter than recorded: never send fewer bytes than declared silently
                    self.close_connection = True
                    return
                remaining -= len(chunk)
                yield chunk

    @staticmethod
    def _parse_range(header: str, size: int) -> tuple[int, int] | str | None:
        """(start, end) inclusive, "unsatisfiable", or None to ignore the header (malformed or multi-range)."""
        m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header, re.IGNORECASE)
        if not m or (not m.group(1) and not m.group(2)):
            return None
        first, last = m.group(1), m.group(2)
        if not first:  # suffix: the last n bytes
            n = int(last)
            if n == 0 or size == 0:
                return "unsatisfiable"
            return max(0, size - n), size - 1
        start = int(first)
        end = int(last) if last else size - 1
        if last and end < start:
            return None
        if start >= size:
            return "unsatisfiable"
        return start, min(end, size - 1)


class _TokenBucket:
    """One link's bandwidth, shared by every connection: a sender takes tokens (bytes) before writing and sleeps
    off any debt, so N parallel answers share ``rate`` between them. Holds at most ``burst`` bytes of credit."""

    def __init__(self, rate: float, burst: int = PACE_CHUNK) -> None:
        if not rate > 0:
            raise ValueError(f"bandwidth must be positive, got {rate!r}")
        self.rate = float(rate)
        self.burst = float(burst)
        self._tokens = float(burst)
        self._stamp = time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        """Block until ``n`` more bytes may go out on the link."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate) - n
            self._stamp = now
            wait = -self._tokens / self.rate
        if wait > 0:
            time.sleep(wait)


def parse_bandwidth(text: str | float) -> float:
    """Bytes per second from ``1gbit``, ``100mbit``, ``50MB``, ``20MiB/s``, ``8e6`` (a bare number is bytes/s).

    Prefixes k, M, G, T are decimal (any case), Ki, Mi, Gi, Ti binary; ``bit``/``bits``/``bps`` or a lowercase
    ``b`` are bits, ``B`` (or no unit) bytes; an optional ``/s`` ends it."""
    if isinstance(text, (int, float)):
        rate = float(text)
    else:
        m = re.fullmatch(
            r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtT]i?)?(bits?|bps|b|B)?(?:/s)?\s*", str(text)
        )
        if not m:
            raise ValueError(f"not a bandwidth: {text!r} (e.g. 1gbit, 100mbit, 50MB, or bytes per second)")
        number, prefix, unit = m.groups()
        rate = float(number) * _UNITS[(prefix or "").lower()]
        if unit is not None and unit != "B":
            rate /= 8
    if not rate > 0 or rate == float("inf"):
        raise ValueError(f"bandwidth must be a positive number of bytes per second, got {text!r}")
    return rate


class HubServer:
    """A running :class:`LocalHub` server (daemon thread); a context manager that stops it on exit.

    ``endpoint`` is ``http://HOST:PORT``; ``requests`` logs every request as {"method", "path" (URL path,
    unquoted), "query" (dict of lists), "status" (None: reset before any answer), "range" (Range header or
    None), "auth" (a bearer token was sent), "fault" (the kind of the injected fault, or None), "time"
    (``time.monotonic()`` when the answer started), "bytes" (body bytes written for the answer so far, 0 for a
    HEAD; final once the answer is done)}.

    ``bandwidth`` (bytes per second, None: unlimited) paces every body (files and JSON) through one token bucket
    shared by all connections, as one link would: parallel downloads share it. Bodies then go out in writes of at
    most 64 KiB, with 64 KiB of burst, which keeps the rate within a few percent over a second or more.
    ``latency`` (seconds) is waited before each answer (time to first byte, as a remote CDN's round trip).
    """

    def __init__(
        self,
        hub: LocalHub,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        bandwidth: float | str | None = None,
        latency: float = 0.0,
    ) -> None:
        self.hub = hub
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self.bandwidth = None if bandwidth is None else parse_bandwidth(bandwidth)
        self.latency = max(0.0, float(latency))
        self._bucket = None if self.bandwidth is None else _TokenBucket(self.bandwidth)
        self._httpd = _Server((host, port), _Handler, hub, self)
        bound_port = self._httpd.server_address[1]
        shown = "127.0.0.1" if host in ("", "0.0.0.0") else ("[::1]" if host == "::" else host)
        if ":" in shown and not shown.startswith("["):
            shown = f"[{shown}]"
        self.endpoint = f"http://{shown}:{bound_port}"
        self._stopped = False
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name=f"localhub:{bound_port}", daemon=True
        )
        self._thread.start()

    def bytes_sent(self, pattern: str = "*") -> int:
        """Body bytes written for the GETs of files (``/{repo}/resolve/...``) whose URL path (unquoted) matches
        the fnmatch ``pattern``."""
        with self._lock:
            return sum(
                r["bytes"]
                for r in self.requests
                if r["method"] == "GET" and "/resolve/" in r["path"] and fnmatch.fnmatchcase(r["path"], pattern)
            )

    def stop(self) -> None:
        """Stop serving and close open connections (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        self._httpd.shutdown()
        with self._httpd.conn_lock:
            conns = list(self._httpd.connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> HubServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"HubServer({self.endpoint!r}, root={str(self.hub.root)!r})"


# -------------------------------------------------------------------- command line


def _bandwidth_arg(text: str) -> float:
    try:
        return parse_bandwidth(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def main(argv: list[str] | None = None) -> int:
    """``python -m modelvec.testing.localhub ROOT [--host H] [--port P] [--token T ...] [--bandwidth B]
    [--latency S] [-- CMD ARGS...]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m modelvec.testing.localhub",
        description="Serve a local Hugging Face Hub from ROOT; with `-- CMD ARGS...`, run CMD with HF_ENDPOINT "
        "pointing at it and exit with its status.",
    )
    parser.add_argument("root", help="folder holding the repos")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--token", action="append", default=[], help="a bearer token accepted for gated/private repos (repeatable)"
    )
    parser.add_argument("--page-size", type=int, default=50, help="items per page of /api/models")
    parser.add_argument(
        "--bandwidth",
        type=_bandwidth_arg,
        default=None,
        help="the link's bandwidth shared by all downloads, e.g. 1gbit, 100mbit, 50MB (bytes/s if a bare number); "
        "default unlimited",
    )
    parser.add_argument(
        "--latency", type=float, default=0.0, help="seconds before each answer starts (a remote CDN's round trip)"
    )
    args = parser.parse_args(argv)

    hub = LocalHub(args.root, tokens=args.token, page_size=args.page_size)
    with hub.serve(args.host, args.port, bandwidth=args.bandwidth, latency=args.latency) as server:
        if command:
            env = {**os.environ, "HF_ENDPOINT": server.endpoint}
            try:
                code = subprocess.run(command, env=env).returncode
            except FileNotFoundError as err:
                print(f"localhub: cannot run {command[0]!r}: {err}", file=sys.stderr)
                return 127
            return code if code >= 0 else 128 - code
        print(server.endpoint, flush=True)
        stop = threading.Event()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
