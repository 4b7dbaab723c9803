"""How the local Hub's handler answers: each request logged before its answer reaches the wire, JSON answers and
Hub errors, and bodies paced by the bandwidth, counted in the log and shaped by the request's
:class:`.faults.Fault` (cut short, stalled, reset)."""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler
from typing import Any

from .bandwidth import PACE_CHUNK
from .faults import NO_FAULT, Fault


class _HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


class _Answers(BaseHTTPRequestHandler):
    """The handler's plumbing; :class:`.routes._Handler` adds what each endpoint answers."""

    protocol_version = "HTTP/1.1"
    server_version = "LocalHub/1"
    timeout = 300  # idle keep-alive connections close after this many seconds
    server: Any  # server._Server, which imports this module's subclass: named here, not imported (no circle)
    # defaults for answers sent before _dispatch ran (malformed request line, unknown method)
    _path, _raw_path, _query, _token, _valid, _answered = "", "", {}, None, False, False
    _fault: Fault = NO_FAULT
    _record: dict | None = None

    def log_message(self, format: str, *args: Any) -> None:
        pass

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
