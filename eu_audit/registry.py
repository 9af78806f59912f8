"""Decorator registries, so users add models, suites, tools, engines or methods without editing ours.

A registry maps a name to an object. It fills itself on first use, in this order:

1. installed packages' group ``eu_audit.plugins`` (``eu_audit.plugins``, loaded once for every registry):
   it may add a data set (``eu_audit.plugins.add_data_set``) whose modules step 2 imports;
2. its *built-in modules* and the data sets' modules of its kind, named as strings (importing one registers
   its objects), so a registry never imports the modules that register into it and no import cycle forms;
3. the group ``eu_audit.<kind>`` of this registry (each entry point is loaded once).

``eu_audit.plugins`` lists every registry: the extension points in one place.

The kind is a Python identifier because it names that entry-point group.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

from eu_audit.errors import BadInput

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])


#: the code of helpers that register on their caller's behalf (``metric``, ``@method``, ``@tool``): the
#: registration is their caller's, so the origin is looked for beyond them
_FORWARDERS: set[object] = set()


def forwards_registration(fn: F) -> F:
    """Mark ``fn`` as a helper that registers what its caller defines (its caller is the origin)."""
    _FORWARDERS.add(fn.__code__)
    return fn


def _registering_module() -> str:
    """The module that registers: the first caller outside this module and the helpers that forward a
    registration (``forwards_registration``): a built-in module of eu-audit (at import, or in a function
    it calls later), a plug-in's module, a test or a script."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_globals.get("__name__") == __name__ or frame.f_code in _FORWARDERS):
        frame = frame.f_back  # type: ignore[assignment]
    return str(frame.f_globals.get("__name__", "")) if frame is not None else ""


class Registry(Generic[T]):
    def __init__(self, kind: str, *, builtins: Sequence[str] = ()) -> None:
        if not kind.isidentifier():
            raise ValueError(f"registry kind {kind!r} must be an identifier (it names eu_audit.{kind})")
        self.kind = kind
        self.builtins = tuple(builtins)
        self._items: dict[str, T] = {}
        self._origins: dict[str, str] = {}
        self._loaded = False

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
        self._origins[key] = _registering_module()

    def origins(self) -> dict[str, str]:
        """name -> the module whose body registered it (``plugins.origin_of`` names its distribution)."""
        self.load()
        return dict(self._origins)

    def load(self) -> None:
        """Import the built-in modules, then the installed plugins (once)."""
        if self._loaded:
            return
        self._loaded = True  # before importing: a module that registers must not re-enter
        from eu_audit.plugins import load_plugins, modules_for

        load_plugins()  # first: an installed package may add a data set whose modules this kind imports
        for module in (*self.builtins, *modules_for(self.kind)):
            importlib.import_module(module)
        from eu_audit.plugins import load_group

        load_group(f"eu_audit.{self.kind}")

    def get(self, name: str) -> T:
        self.load()
        try:
            return self._items[name.lower()]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "none"
            raise BadInput(f"unknown {self.label} '{name}' (known: {known})") from None

    @property
    def label(self) -> str:
        """The kind in words, for messages: 'suite_builders' -> 'suite builder'."""
        words = self.kind.replace("_", " ")
        return words[:-1] if words.endswith("s") else words

    def __contains__(self, name: object) -> bool:
        self.load()
        return isinstance(name, str) and name.lower() in self._items

    def names(self) -> list[str]:
        self.load()
        return sorted(self._items)

    def items(self) -> Iterator[tuple[str, T]]:
        self.load()
        return iter(sorted(self._items.items()))

    def in_order(self) -> list[T]:
        """The objects in registration order (``items`` and ``names`` sort by name)."""
        self.load()
        return list(self._items.values())
