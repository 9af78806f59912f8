"""Decorator registries, so users add models, suites, tools or engines without editing ours.

A registry maps a name to an object. Third-party packages can also register through the entry-point
group ``eu_audit.<kind>`` (each entry point is imported once; importing it registers its objects).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from eu_audit.errors import BadInput

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._plugins_loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@SUITES.register("mine")``."""

        def deco(obj: T) -> T:
            self.add(name, obj)
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        key = name.lower()
        if key in self._items and self._items[key] is not obj:
            raise ValueError(f"{self.kind} '{name}' is already registered")
        self._items[key] = obj

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in entry_points(group=f"eu_audit.{self.kind}"):
            ep.load()

    def get(self, name: str) -> T:
        self._load_plugins()
        try:
            return self._items[name.lower()]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "none"
            raise BadInput(f"unknown {self.kind} '{name}' (known: {known})") from None

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return isinstance(name, str) and name.lower() in self._items

    def names(self) -> list[str]:
        self._load_plugins()
        return sorted(self._items)

    def items(self) -> Iterator[tuple[str, T]]:
        self._load_plugins()
        return iter(sorted(self._items.items()))
