"""Imports by name: public names imported on first use (PEP 562), for the package ``__init__`` modules, and
``"module:attribute"`` paths (:func:`import_string`).

``frugalrl`` and ``frugalrl.dpsgd`` expose their public names lazily, so that a worker process that needs
only a small part of the library does not pay for torch and gymnasium at startup.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, public: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package`` whose names ``public`` maps to the modules
    defining them; a name is imported at its first use and then kept in the package's namespace."""

    def getattr_(name: str) -> Any:
        module = public.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted([*vars(sys.modules[package]), *public])

    return getattr_, dir_


def import_string(path: str) -> Any:
    """Import ``"package.module:attr"``; raise a clear ``ValueError`` if that fails."""
    if not isinstance(path, str) or ":" not in path:
        raise ValueError(f"expected an import path of the form 'module:attribute', got {path!r}")
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        hint = ""
        if isinstance(e, ModuleNotFoundError) and e.name == module_name.partition(".")[0]:
            hint = " (run from the folder that holds it, or add that folder to PYTHONPATH)"
        raise ValueError(f"cannot import module {module_name!r} from factory path {path!r}: {e}{hint}") from e
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as e:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r} (factory path {path!r})") from e
    return obj
