"""One way for a package to export names of its submodules without importing them until first used.

As huggingface_hub and scientific Python packages do (``lazy_loader``): ``import modelvec`` is instant and
loads torch only when something needs it. A package lists its lazy names once, here, and again under
``if TYPE_CHECKING:`` for type checkers and readers; ``tests/core/test_lazy.py`` checks the two lists agree.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(
    package: str, modules: Mapping[str, Sequence[str]], eager: Sequence[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``: each name in ``modules[sub]`` is imported from
    ``package.sub`` on first use and kept; ``eager`` are names the package defines or imports itself."""
    where = {name: sub for sub, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name in where:
            value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
            globals_of(package)[name] = value  # found directly from now on
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(globals_of(package)) | set(where))

    return __getattr__, __dir__, sorted({*eager, *where})


def globals_of(package: str) -> dict[str, Any]:
    import sys

    return vars(sys.modules[package])


def warm(*modules: str) -> None:
    """Import ``modules`` on a background thread now, so that a later import finds them loaded.

    For a command whose own work leaves the interpreter idle (threads in BLAS and LAPACK, which release the
    GIL): the rank study imports matplotlib and scipy's optimiser while its eigenvalues are computed. A
    module that fails to import is left to fail, with its own error, where it is imported for real.
    """
    import threading

    def load() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:
                pass

    threading.Thread(target=load, name="modelvec-warm-imports", daemon=True).start()
