"""Imports by name: public names imported on first use (PEP 562), for the package ``__init__`` modules,
``"module:attribute"`` paths (:func:`import_string`), and one module of a package whose ``__init__`` imports far
more than that module needs (:func:`import_without_package`).

``frugalrl`` and ``frugalrl.dpsgd`` expose their public names lazily, so that a worker process that needs
only a small part of the library does not pay for torch and gymnasium at startup.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
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


def import_without_package(name: str, alias: str | None = None) -> ModuleType:
    """Module ``name`` (``"package.sub.module"``), loaded from its file without running its package's ``__init__``
    where the package is not imported yet: Stable-Baselines3's imports its algorithms and so torch, MinAtar's
    seaborn, pandas and scipy for its display, while the module asked for needs only numpy or Gymnasium (a worker
    process then holds ~120–190 MB less). It is kept in ``sys.modules`` under ``name`` (a later import of the
    package uses the same module: SB3's ``Monitor`` stays one class) or under ``alias`` (the package's own import of
    ``name`` stays untouched: ``import package.sub.module`` would find a child whose parents were never imported).
    Where the package is imported already, or its files are laid out otherwise, the plain import."""
    module = sys.modules.get(alias or name)
    if module is not None:
        return module
    top, *parts = name.split(".")
    package = importlib.util.find_spec(top) if parts and top not in sys.modules else None  # found, not imported
    paths = list(package.submodule_search_locations or []) if package is not None else []
    path = Path(paths[0], *parts[:-1], f"{parts[-1]}.py") if paths else None
    spec = importlib.util.spec_from_file_location(alias or name, path) if path is not None and path.is_file() else None
    if spec is None or spec.loader is None:
        return importlib.import_module(name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias or name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[alias or name]
        raise
    return module
