"""Submodules loaded on first use (PEP 562): the module ``__getattr__`` and ``__dir__`` of a package.

``attnlib.experiments`` and ``attnlib.figures`` hold one module per chapter; a page pays the imports
of its own chapter only.

>>> import types
>>> getattr_, dir_ = lazy_submodules("json", ["decoder"], {"__doc__": None})
>>> isinstance(getattr_("decoder"), types.ModuleType), dir_()
(True, ['__doc__', 'decoder'])
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable

__all__ = ["lazy_submodules"]


def lazy_submodules(package: str, names: Iterable[str], namespace: dict) -> tuple[Callable, Callable]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` whose submodules ``names`` load on first access.

    ``namespace`` is the package's ``globals()``; importing a submodule binds it there, so the module
    ``__getattr__`` runs once per submodule.
    """
    lazy = frozenset(names)

    def __getattr__(name: str):
        if name in lazy:
            return importlib.import_module(f".{name}", package)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | lazy)

    return __getattr__, __dir__
