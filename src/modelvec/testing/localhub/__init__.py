"""A local Hugging Face Hub on loopback, for tests and the demo (a package: state, faults, HTTP server, command line).

The real Hub is unreachable here, so this package serves, from a folder on disk, the part of the Hub HTTP API
that modelvec reaches through ``huggingface_hub`` (model listing with pagination, model info at a revision,
the repository tree that ``snapshot_download`` lists, file resolve with HEAD and byte ranges, the Hub's error
codes), plus fault injection (error statuses, stalls, dropped and reset connections, bodies or headers that do not
match the file, range requests answered with the whole file or another range; each a number of times, or at a seeded
random rate across a whole crawl; repositories deleted mid-run), a bandwidth limit and latency, a count of the bytes
each answer sent, and hostile answers (forged ids, revisions and file names). Point ``HF_ENDPOINT`` (or
``HfApi(endpoint=...)``) at :attr:`HubServer.endpoint`.

Modules:

    hub.py      :class:`LocalHub`: the repositories' state, publishing, and the faults and forgeries armed on it
    store.py    how a repository is kept on disk (layout, blobs, commits, metadata, card front matter)
    views.py    what the API says about a repository at a commit (its fields, tags and tree)
    faults.py   fault injection: the rules :meth:`LocalHub.fail` arms and the fault each request draws
    server.py   :class:`HubServer`: the running HTTP server, its request log and byte counts
    routes.py   the request handler: the Hub API's endpoints routed to a :class:`LocalHub`
    answers.py  how the handler answers: the request log, JSON and errors, bodies shaped by the faults
    bandwidth.py  the bandwidth limit: :func:`parse_bandwidth` and the token bucket every connection shares
    cli.py      the command line, ``python -m modelvec.testing.localhub`` (run by ``__main__.py``)

Only model repos; no uploads over HTTP (publish with :meth:`LocalHub.publish`). Standard library plus PyYAML.
"""

from .bandwidth import parse_bandwidth
from .cli import main
from .hub import LocalHub
from .server import HubServer

__all__ = ["HubServer", "LocalHub", "main", "parse_bandwidth"]
