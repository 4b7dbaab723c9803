"""The local Hub's HTTP server: :class:`HubServer` (a running server, its request log and byte counts), the request
handler that routes the Hub API's endpoints to a :class:`LocalHub` and sends its answers as the request's
:class:`.faults.Fault` shapes them, and the bandwidth limit (:func:`parse_bandwidth`, a shared token bucket)."""

from __future__ import annotations

import fnmatch
import json
import re
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from .faults import NO_FAULT, Fault, Faults
from .store import CHUNK
from .views import EXPANDABLE, INFO_FIELDS, LIST_DEFAULT, LIST_FULL, SORT_KEYS, TREE_PAGE_EXPANDED, children_counts

_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
PACE_CHUNK = 64 << 10  # bytes per write (and the token bucket's burst) when a bandwidth is set
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


class ServedHub(Protocol):
    """What the server uses of the hub it serves (:class:`~.hub.LocalHub`, which starts it: the server never
    imports it): its tokens and page sizes, its repositories' state under its lock, and its fault rules."""

    @property
    def root(self) -> Path: ...
    @property
    def tokens(self) -> frozenset[str]: ...
    @property
    def page_size(self) -> int: ...
    @property
    def tree_page_size(self) -> int: ...
    @property
    def _lock(self) -> AbstractContextManager[Any]: ...
    @property
    def _repos(self) -> dict[str, tuple[tuple, dict]]: ...
    @property
    def _faults(self) -> Faults: ...
    def _count_request(self, path: str) -> None: ...
    def _refresh(self) -> None: ...
    def _state(self, repo_id: str) -> dict | None: ...
    def _repo_dir(self, repo_id: str) -> Path: ...
    def _unforge(self, repo_id: str, revision: str) -> str: ...
    def _fields(self, state: dict, sha: str, *, blobs: bool = False) -> dict: ...
    def _tree(self, state: dict, sha: str, path: str, recursive: bool, expand: bool) -> list[dict] | None: ...


def _truthy(values: list[str] | None) -> bool:
    return bool(values) and values[-1] in ("true", "True", "1")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # keep-alive connections of a pooled client must not block stop()

    def __init__(self, address, handler, hub: ServedHub, owner: HubServer) -> None:
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
    _fault: Fault = NO_FAULT
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
        headers = getattr(self, "headers", None)  # none yet when the request line itself was malformed
        record = {
            "method": self.command,
            "path": self._path,
            "query": self._query,
            "status": code,
            "range": headers.get("Range") if headers is not None else None,
            "auth": self._token is not None,
            "fault": self._fault.kind,
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
        """Send a body (whose first byte is byte ``offset`` of the file) as the request's fault shapes it."""
        for piece in self._fault.body(chunks, offset):
            if not isinstance(piece, str):
                self._emit(piece)
            elif piece == "slow":
                self.wfile.flush()
                time.sleep(self._fault.delay)
            elif piece == "reset":
                self._reset()
            else:  # short: close cleanly although Content-Length announced more
                self.close_connection = True
                self.wfile.flush()

    def _send_json(self, status: int, payload: Any, headers: dict | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self._fault.closes(self.command):
            self.close_connection = True
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self._write_body([body])

    def _send_error(self, err: _HubError) -> None:
        headers = self._fault.headers(dict(err.headers))
        if err.code:
            headers["X-Error-Code"] = err.code
        headers["X-Error-Message"] = err.message
        self._send_json(err.status, {"error": err.message}, headers)

    def _dispatch(self, method: str) -> None:
        self._answered = False
        self._fault = NO_FAULT
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
            fault = self._fault = hub._faults.take(method, self._path, ranged=bool(self.headers.get("Range")))
            error = fault.error()
            if error is not None:
                self._send_json(*error)
                return
            if fault.before_answer == "slow":
                time.sleep(fault.delay)
            elif fault.before_answer == "reset":
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
        return [p for p in EXPANDABLE if p in props]

    # ------------------------------------------------------------ endpoints

    def _list_models(self) -> None:
        hub, q = self.server.hub, self._query
        filters = [f.lower() for f in q.get("filter", []) if f]
        search = (q.get("search") or [""])[-1].lower()
        author = (q.get("author") or [""])[-1].lower()
        sort = (q.get("sort") or ["downloads"])[-1]
        sort = sort if sort in SORT_KEYS else "downloads"
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
            keys = list(LIST_DEFAULT)
            if _truthy(q.get("full")):
                keys += LIST_FULL
            if _truthy(q.get("cardData")):
                keys.append("cardData")
            if _truthy(q.get("config")):
                keys.append("config")
        if "childrenModelCount" in keys:
            children = children_counts(states)
            for fields in page:
                fields["childrenModelCount"] = children.get(fields["id"].lower(), 0)
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
        keys = ["_id", "id", *expand] if expand is not None else list(INFO_FIELDS)
        if "childrenModelCount" in keys:
            with self.server.hub._lock:
                self.server.hub._refresh()
                states = [s for _, s in self.server.hub._repos.values()]
            fields["childrenModelCount"] = children_counts(states).get(fields["id"].lower(), 0)
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
        if method == "GET" and self.headers.get("Range") and not fault.ignores_range:
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
        keep = fault.keep(hub._faults.take_truncation(self._path) if method == "GET" else None)

        self.send_response(status)
        for key, value in fault.headers(common).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(fault.announced(method, length)))
        source = start  # where in the file the body comes from
        if status == 206:
            source = fault.source(start, length, size)
            self.send_header("Content-Range", fault.content_range(start, end, size))
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


# -------------------------------------------------------------------- bandwidth


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


# -------------------------------------------------------------------- the running server


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
        hub: ServedHub,
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
