"""Sources of the shipped repositories: one module per repository, each with DESCRIPTION and FILES."""

from __future__ import annotations

from importlib import import_module

NAMES = ("calendarlib", "geomlib", "gridpath", "intervals", "inventory", "money", "statskit", "textkit")

REPOS: dict[str, tuple[str, dict[str, str]]] = {}
for _name in NAMES:
    _module = import_module(f"{__name__}.{_name}")
    REPOS[_name] = (_module.DESCRIPTION, _module.FILES)
