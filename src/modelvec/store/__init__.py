"""The store: one DuckDB file of vectors, failures and the Hub catalogue, and the vectors' bytes beside it.

``store`` (the :class:`Store`: opening and closing, its files; its ``reads``, its bases' ``versions`` and its
``writes``), ``writer`` (rows and the background writer), ``vectorfile`` (the append-only float32 file),
``blocks`` (vectors read a block at a time, checked), ``products`` (the vectors' inner products), ``cache``
(the one owner of the cache files beside the store, each a verified ``cachefile``: products, spreads, layouts, the
tree, the probe inputs), ``bases`` (which base is stored under which name), ``population`` (one base's vectors as
the reports read them), ``overview`` (what ``show`` prints), ``schema`` (tables and migrations), ``lock`` (waiting
for another process) and ``export`` (Parquet).
"""

from ..core.errors import StoreError, StoreLockedError
from .blocks import Selection
from .lock import default_wait
from .overview import overview
from .population import Population
from .products import Products
from .records import Failure, VectorRow, trace_record
from .store import DEFAULT_STORE, Store, default_store_path, opened, options_of
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
