"""The request handler of the local Hub: it routes the Hub API's endpoints (model listing, model info, the
repository tree, file resolve with HEAD and byte ranges) to a :class:`LocalHub` and answers as the Hub does
(through :mod:`.answers`)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from .answers import _Answers, _HubError
from .faults import NO_FAULT
from .store import CHUNK
from .views import EXPANDABLE, INFO_FIELDS, LIST_DEFAULT, LIST_FULL, SORT_KEYS, TREE_PAGE_EXPANDED, children_counts

_SHA_RE = re.compile(r"^[0-9a-f]{40}$")


def _truthy(values: list[str] | None) -> bool:
    return bool(values) and values[-1] in ("true", "True", "1")


class _Handler(_Answers):
    """Each request routed to its endpoint, and what the Hub answers there."""

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def _other(self) -> None:
        self.close_connection = True  # a body we do not read may follow
        self._dispatch(self.command)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _other

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
