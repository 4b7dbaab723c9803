"""The local Hub's state: :class:`LocalHub`, its model repositories on disk (publish, metadata, deletion), the
faults and forgeries armed on it, and what its API answers about a repository; :meth:`LocalHub.serve` serves it."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from . import store, views
from .faults import Faults
from .server import HubServer


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
        self._faults = Faults(self._lock)  # fail, truncate and deferred delete rules, which the handler consults
        self._forged: dict[str, dict] = {}
        self._forged_trees: dict[str, dict[str, dict]] = {}  # repo_id -> {path: fields of its tree entry}
        self._refresh()

    # ---------------------------------------------------------------- state on disk

    def _repo_dir(self, repo_id: str) -> Path:
        owner, name = store.check_repo_id(repo_id)
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
        owner, _ = store.check_repo_id(repo_id)
        meta = store.check_meta(meta)
        collected = store.collect(files, unsafe_paths)
        blobs = self._repo_dir(repo_id) / "blobs"
        tree = {path: store.store_blob(blobs, source, link) for path, source in sorted(collected.items())}
        card, config = store.card_and_config(blobs, tree)
        with self._lock:
            current = self._state(repo_id)
            state = json.loads(json.dumps(current)) if current is not None else store.new_state(repo_id, owner)
            parent = state["refs"].get("main")
            sha = store.commit_sha(parent, tree, message)
            state["commits"][sha] = {
                "parent": parent,
                "message": message,
                "date": store.now(),
                "files": tree,
                "card": card,
                "config": config,
                "safetensors": store.safetensors_info(blobs, tree),
            }
            state["refs"]["main"] = sha
            state["meta"].update(meta)
            self._write_state(repo_id, state)
        return sha

    def set_meta(self, repo_id: str, **meta: Any) -> None:
        """Update a repo's metadata (same keys as :meth:`publish`) without a new commit."""
        meta = store.check_meta(meta)
        with self._lock:
            current = self._state(repo_id)
            if current is None:
                raise KeyError(f"no repo {repo_id!r} in {self.root}")
            state = json.loads(json.dumps(current))
            state["meta"].update(meta)
            self._write_state(repo_id, state)

    # ---------------------------------------------------------------- fault injection (kept in .faults)

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
        self._faults.add(
            pattern,
            kind=kind,
            status=status,
            times=times,
            methods=methods,
            retry_after=retry_after,
            after_bytes=after_bytes,
            delay=delay,
            value=value,
            rate=rate,
            seed=seed,
        )

    def truncate(self, pattern: str, *, keep: int, times: int | None = None) -> None:
        """GET bodies of matching resolve paths stop after ``keep`` bytes and the connection is closed, while
        Content-Length declares the full length; for the next ``times`` GETs (None: always)."""
        self._faults.truncate(pattern, keep, times)

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
                self._faults.delete_after(repo_id, after, pattern)

    def _remove(self, repo_id: str) -> None:
        with self._lock:
            shutil.rmtree(self._repo_dir(repo_id), ignore_errors=True)
            self._repos.pop(repo_id, None)

    def _count_request(self, path: str) -> None:
        """A request came in: the deletions waiting for it count it, and those whose count is reached happen."""
        with self._lock:
            for repo_id in self._faults.due(path):
                self._remove(repo_id)

    def clear_faults(self) -> None:
        """Drop every pending :meth:`fail` and :meth:`truncate` rule, every :meth:`forge` and every :meth:`delete`
        still waiting for its requests."""
        with self._lock:
            self._faults.clear()
            self._forged.clear()
            self._forged_trees.clear()

    # ---------------------------------------------------------------- hostile answers

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

    def _unforge(self, repo_id: str, revision: str) -> str:
        """A forged sha of ``repo_id`` names its ``main``."""
        with self._lock:
            forged = self._forged.get(repo_id, {})
        return "main" if "sha" in forged and revision == forged["sha"] else revision

    # ---------------------------------------------------------------- answers

    def _fields(self, state: dict, sha: str, *, blobs: bool = False) -> dict:
        """Every property of the repo at commit ``sha`` (tags and counters from main), as the Hub names them, with
        the fields :meth:`forge` made up in place of the true ones."""
        fields = views.fields(state, sha, blobs=blobs)
        with self._lock:
            fields.update(json.loads(json.dumps(self._forged.get(state["id"], {}))))
        return fields

    def _tree(self, state: dict, sha: str, path: str, recursive: bool, expand: bool) -> list[dict] | None:
        """The entries of the repository's tree listing at ``sha`` (see :func:`.views.tree`; None when ``path`` is no
        folder), with the file entries :meth:`forge` made up: changed fields, and files the commit does not have."""
        out = views.tree(state, sha, path, recursive, expand)
        if out is None:
            return None
        with self._lock:
            forged = json.loads(json.dumps(self._forged_trees.get(state["id"], {})))
        for entry in out:
            entry.update(forged.pop(entry["path"], {}) if entry["type"] == "file" else {})
        out += [
            {"type": "file", "oid": "0" * 40, "size": 0, "path": p, **fields} for p, fields in sorted(forged.items())
        ]
        return out

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
