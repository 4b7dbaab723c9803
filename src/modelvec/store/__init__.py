"""The store: one DuckDB file of vectors, failures and the Hub catalogue, and the vectors' bytes beside it.

``store`` (the :class:`Store`), ``writer`` (rows and the background writer), ``vectorfile`` (the
append-only float32 file), ``products`` (the vectors' inner products, read in blocks and kept beside the
store, verified: ``kept``), ``population`` (one base's vectors as the reports read them), ``schema`` (tables and
migrations), ``lock`` (waiting for another process) and ``export`` (Parquet).
"""

from ..core.errors import StoreError, StoreLockedError
from .lock import default_wait
from .population import Population, overview
from .products import Products, Selection
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
