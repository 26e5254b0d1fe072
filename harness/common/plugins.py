"""Registries filled by their modules: importing every module of a package registers what
each defines, so a new entry is one new file in that package."""

from __future__ import annotations

import importlib
import pkgutil


def import_package(name: str) -> None:
    """Import every module of the package `name` (modules already imported are not read again;
    one added since the last call is)."""
    package = importlib.import_module(name)
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{name}.{module.name}")
