"""The HTTP library that huggingface_hub's client is built on, whose errors and responses modelvec handles.

huggingface_hub 2 is built on ``httpx2``, huggingface_hub 1 on ``httpx`` (the same API under its older name): modelvec
takes the one huggingface_hub imports, since catching the other's errors would catch nothing. Import it from here as
``httpx2`` (its name from huggingface_hub 2 on, which type-checking sees).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx2
else:
    from huggingface_hub import __version__ as _hub_version

    httpx2 = importlib.import_module("httpx2" if int(_hub_version.split(".")[0]) >= 2 else "httpx")

__all__ = ["httpx2"]
