"""Module attributes imported on first use (PEP 562), for the packages whose public names live in heavy submodules:
importing ``dp_operators.ledger`` must not import SQLAlchemy until a ledger name is used (tests/test_lazy_imports.py).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, table: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__``: a name in ``table`` (public name -> defining submodule of
    ``package``) is imported from its submodule on first use and kept in the package, so later lookups skip the hook.
    Any other name raises ``AttributeError`` (so ``from package import submodule`` still imports the submodule)."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__
