"""The layout registry: ``PCPConfig(..., layout=name)`` finds its :class:`pcp_fn.Layout` here.

Built-in layouts are found, not pre-registered: :data:`BUILTIN_LAYOUTS` names the module
attribute that holds each one (``"dcs" -> pcp_fn.dcs:LAYOUT``), loaded the first time the
name is looked up. So a config works whatever was imported first, and nothing registers
itself as an import side effect; a researcher's layout is registered with
:func:`register_layout` (or by passing the object as ``PCPConfig(..., layout=obj)``).

This module sits at the bottom of :mod:`pcp_fn.protocol` (the config resolves its layout
here, and the protocol's own module names the config): it checks a layout by the members
it has (:data:`PROTOCOL_MEMBERS`, the members of :class:`pcp_fn.Layout`).
"""

from __future__ import annotations

import importlib
from typing import Protocol

#: name -> ``(module, attribute)`` of each built-in layout, in the order they are listed.
BUILTIN_LAYOUTS: dict[str, tuple[str, str]] = {
    "dcs": ("pcp_fn.dcs", "LAYOUT"),
    "hybrid": ("pcp_fn.hybrid", "LAYOUT"),
    "mrv2": ("pcp_fn.mrv2", "LAYOUT"),
    "mrv2-sharded": ("pcp_fn.mrv2", "SHARDED_LAYOUT"),
}

#: What a :class:`pcp_fn.Layout` implements (its protocol's members).
PROTOCOL_MEMBERS = (
    "name",
    "num_local_tokens",
    "build",
    "state_geometry",
    "logits_from_geometry",
    "restore_index",
    "gathered_order",
    "state_local_rows",
    "state_local_start",
    "restored_spans",
    "first_pass_rows",
)


class NamedLayout(Protocol):
    """A registry entry: a :class:`pcp_fn.Layout` (which extends this), found by its ``name``."""

    name: str


_REGISTRY: dict[str, NamedLayout] = {}  # name -> layout: the built-ins loaded so far, then registrations


def _lookup(name: str) -> NamedLayout | None:
    """The layout registered as ``name``, loading the built-in of that name on first use."""
    held = _REGISTRY.get(name)
    if held is None and name in BUILTIN_LAYOUTS:
        module, attribute = BUILTIN_LAYOUTS[name]
        held = _REGISTRY[name] = getattr(importlib.import_module(module), attribute)
    return held


def register_layout(layout: NamedLayout, *, replace: bool = False) -> NamedLayout:
    """Make ``layout`` selectable as ``PCPConfig(..., layout=layout.name)``; returns it.

    Raises ``ValueError`` when an object of another class holds the name, a built-in
    included (``replace=True`` overrides; another instance of the same class replaces it:
    a notebook re-running its cell), and ``TypeError`` when ``layout`` does not
    implement :class:`pcp_fn.Layout`.
    """
    missing = [m for m in PROTOCOL_MEMBERS if not hasattr(layout, m)]
    if missing:
        raise TypeError(f"{layout!r} is not a pcp_fn.Layout: it lacks {missing}")
    name = layout.name
    if not isinstance(name, str) or not name:
        raise TypeError(f"a layout's name must be a non-empty str, got {name!r}")
    held = _lookup(name)
    if held is not None and type(held) is not type(layout) and not replace:
        raise ValueError(f"layout name {name!r} is already registered to {held!r}")
    _REGISTRY[name] = layout
    return layout


def get_layout(name: str) -> NamedLayout:
    """The layout called ``name`` (a built-in or a registered one)."""
    held = _lookup(name)
    if held is None:
        raise ValueError(f"unknown layout {name!r}; registered: {sorted(available_layouts())}")
    return held


def available_layouts() -> tuple[str, ...]:
    """Names of the available layouts: the built-ins, then the registered ones in order."""
    return tuple(dict.fromkeys([*BUILTIN_LAYOUTS, *_REGISTRY]))
