"""The local Hub's command line, ``python -m modelvec.testing.localhub``: serve a root, or run a command against it."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading

from .bandwidth import parse_bandwidth
from .hub import LocalHub


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
