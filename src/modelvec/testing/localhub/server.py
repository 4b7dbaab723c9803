"""The local Hub's HTTP server: :class:`HubServer` (a running server, its request log and byte counts) over a
threading HTTP server that keeps its connections, so that stopping closes them. The handler that answers each
request is :mod:`.routes`; the bandwidth limit is :mod:`.bandwidth`."""

from __future__ import annotations

import fnmatch
import socket
import sys
import threading
from contextlib import AbstractContextManager
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from .bandwidth import _TokenBucket, parse_bandwidth
from .faults import Faults
from .routes import _Handler


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
