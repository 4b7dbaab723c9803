"""The store: one DuckDB file of vectors, failures and the Hub catalogue, and the vectors' bytes beside it.

Four groups: ``formats/`` (the files on disk: the vector file, the tables, the lock, the kept files' format); the
:class:`Store` itself (``store``: opening and closing; its parts over one ``connection``: ``reads``, its bases'
``versions``, ``writes`` and the background ``writer``; ``opening``: its files checked as it opens); ``derived/``
(files derived from it and kept beside it: products, nearest lists, probe inputs); ``views/`` (what the reports
read: one base's ``Population``, the copies, the overview, the export).
"""

from ..core.errors import StoreError, StoreLockedError
from .derived.products import Products
from .formats.blocks import Selection
from .formats.lock import default_wait
from .formats.records import Failure, VectorRow, trace_record
from .store import DEFAULT_STORE, Store, default_store_path, opened, options_of
from .views.overview import overview
from .views.population import Population
from .writer import StoreWriter

__all__ = [
    "DEFAULT_STORE",
    "Failure",
    "Population",
    "Products",
    "Selection",
    "Store",
    "StoreError",
    "StoreLockedError",
    "StoreWriter",
    "VectorRow",
    "default_store_path",
    "default_wait",
    "opened",
    "options_of",
    "overview",
    "trace_record",
]
