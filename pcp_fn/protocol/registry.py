"""The layout registry: `PCPConfig(..., layout=name)` finds its [`pcp_fn.Layout`][] here.

Built-in layouts are found, not pre-registered:
[`BUILTIN_LAYOUTS`][pcp_fn.protocol.registry.BUILTIN_LAYOUTS] names the module attribute that holds
each one (`"dcs" -> pcp_fn.dcs:LAYOUT`), loaded the first time the name is looked up. So a config
works whatever was imported first, and nothing registers itself as an import side effect; a
researcher's layout is registered with [`register_layout`][pcp_fn.register_layout] (or by passing
the object as `PCPConfig(..., layout=obj)`) and removed with
[`unregister_layout`][pcp_fn.unregister_layout].

This module sits at the bottom of [`pcp_fn.protocol`][] (the config resolves its layout
here, and the protocol's own module names the config): it checks a layout by the members
it has ([`PROTOCOL_MEMBERS`][pcp_fn.protocol.registry.PROTOCOL_MEMBERS], the members of [`pcp_fn.Layout`][]).
"""

from __future__ import annotations

import importlib
from typing import Protocol

BUILTIN_LAYOUTS: dict[str, tuple[str, str]] = {
    "dcs": ("pcp_fn.dcs", "LAYOUT"),
    "hybrid": ("pcp_fn.hybrid", "LAYOUT"),
    "mrv2": ("pcp_fn.mrv2", "LAYOUT"),
    "mrv2-sharded": ("pcp_fn.mrv2", "SHARDED_LAYOUT"),
    "round-robin": ("pcp_fn.mrv2", "ROUND_ROBIN_LAYOUT"),
    "cost-balanced": ("pcp_fn.mrv2", "COST_BALANCED_LAYOUT"),
    "round-robin-sharded": ("pcp_fn.mrv2", "ROUND_ROBIN_SHARDED_LAYOUT"),
    "cost-balanced-sharded": ("pcp_fn.mrv2", "COST_BALANCED_SHARDED_LAYOUT"),
}
"""name -> `(module, attribute)` of each built-in layout, in the order they are listed."""

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
"""What a [`pcp_fn.Layout`][] implements (its protocol's members)."""


class LayoutError(ValueError):
    """A layout broke a rule of [`pcp_fn.Layout`][] where the library can see it without a host
    sync: its `num_local_tokens` at [`pcp_fn.make_batch`][], its first run on a few canonical
    batches at [`pcp_fn.init_state`][] ([`pcp_fn.protocol.canonical`][]). `rule`: the
    [`pcp_fn.testing.check_layout`][] rule it breaks (`"capacity"`, `"ownership"`...)."""

    def __init__(self, message: str, rule: str = "") -> None:
        super().__init__(message)
        self.rule = rule

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (str(self), self.rule)  # pickled with its rule (a process boundary)


class NamedLayout(Protocol):
    """A registry entry: a [`pcp_fn.Layout`][] (which extends this), found by its `name`."""

    name: str


_REGISTRY: dict[str, NamedLayout] = {}  # name -> layout: the built-ins loaded so far, then registrations


def _lookup(name: str) -> NamedLayout | None:
    """The layout registered as `name`, loading the built-in of that name on first use."""
    held = _REGISTRY.get(name)
    if held is None and name in BUILTIN_LAYOUTS:
        module, attribute = BUILTIN_LAYOUTS[name]
        held = _REGISTRY[name] = getattr(importlib.import_module(module), attribute)
    return held


def register_layout(layout: NamedLayout, *, replace: bool = False) -> NamedLayout:
    """Make `layout` selectable as `PCPConfig(..., layout=layout.name)`; returns it.

    A name is held by one object. Registering it again is a no-op for the very same object and,
    under a name that is not a built-in's, replaces the holder with another instance of the
    same user class (a notebook re-running its cell: the class is the same by module and
    qualified name, even when the cell made it anew; a [`pcp_fn.PackageLayout`][] of the same
    module). Any other object needs `replace=True`: a built-in (`"dcs"`, `"mrv2"`...),
    whatever the class of the newcomer, and a name held by another class.

    Raises:
        TypeError: `layout` does not implement [`pcp_fn.Layout`][] (a member missing or not
            callable), its `name` is not a non-empty str, or `replace` is not a bool.
        ValueError: the name is held by another object and `replace` is False (the message
            names `replace=True`).
    """
    check_protocol(layout)
    if not isinstance(replace, bool):
        raise TypeError(f"replace must be a bool, got {type(replace).__name__} {replace!r}")
    name = layout.name
    held = _lookup(name)
    if held is not None and not replace and not _same_layout(name, held, layout):
        cls = type(held)
        held_by = f"an instance of {cls.__module__}.{cls.__qualname__}"
        why = "a built-in" if name in BUILTIN_LAYOUTS else held_by
        raise ValueError(
            f"layout name {name!r} is already registered to {held!r} ({why}); pass replace=True to "
            f"replace it with {layout!r}"
        )
    _REGISTRY[name] = layout
    return layout


def unregister_layout(name: str) -> NamedLayout:
    """Remove the layout registered as `name` ([`register_layout`][pcp_fn.register_layout]); returns it.

    The name is free again: registering any layout under it needs no `replace=True`. A built-in
    (`"dcs"`, `"mrv2"`...) cannot be unregistered; a layout registered over a built-in's name with
    `replace=True` is removed and the name is the built-in's again. A config made earlier keeps
    the layout object it bound (`config.layout_impl`); a new `PCPConfig(..., layout=name)`, or
    unpickling a config that names it, raises `ValueError` (unknown layout) until the name is
    registered again.

    Raises:
        TypeError: `name` is not a str.
        ValueError: no layout is registered as `name`, or it is a built-in.
    """
    held = get_layout(name)  # TypeError / ValueError naming the registered names
    if is_builtin(held):
        raise ValueError(
            f"layout {name!r} is a built-in and cannot be unregistered (register_layout(layout, "
            "replace=True) puts another layout under its name; unregister_layout then restores it)"
        )
    del _REGISTRY[name]
    return held


def check_protocol(layout: object) -> None:
    """`layout` has every member of [`pcp_fn.Layout`][] (callable, but `name`: a non-empty
    str); `TypeError` naming what it lacks."""
    missing = [m for m in PROTOCOL_MEMBERS if not hasattr(layout, m)]
    if missing:
        raise TypeError(f"{layout!r} is not a pcp_fn.Layout: it lacks {missing}")
    flat = [m for m in PROTOCOL_MEMBERS[1:] if not callable(getattr(layout, m))]
    if flat:
        raise TypeError(f"{layout!r} is not a pcp_fn.Layout: its {flat} are not callable")
    name = layout.name  # type: ignore[attr-defined]
    if not isinstance(name, str) or not name:
        raise TypeError(f"a layout's name must be a non-empty str, got {name!r}")


def _identity(layout: object) -> tuple[str, ...] | None:
    """What makes two layout objects the same layout re-made: a user class's module and qualified
    name, a [`pcp_fn.PackageLayout`][]'s module; `None` for any other class of the library
    (`MRV2Partition`...: its instances differ by their arguments)."""
    cls = type(layout)
    package = getattr(layout, "package", None)
    if cls.__module__.split(".")[0] != "pcp_fn":
        return ("class", cls.__module__, cls.__qualname__)
    if cls.__qualname__ == "PackageLayout" and package is not None:
        return ("package", getattr(package, "__name__", repr(package)))
    return None


def _same_layout(name: str, held: NamedLayout, layout: NamedLayout) -> bool:
    """`layout` may take `name` from `held` without `replace=True`
    ([`register_layout`][pcp_fn.register_layout])."""
    if held is layout:
        return True
    if name in BUILTIN_LAYOUTS:
        return False
    ident = _identity(layout)
    return ident is not None and ident == _identity(held)


def get_layout(name: str) -> NamedLayout:
    """The layout called `name` (a built-in or a registered one); `ValueError` for an unknown
    name, `TypeError` for a name that is not a str."""
    if not isinstance(name, str):
        raise TypeError(f"a layout name must be a str, got {type(name).__name__} {name!r}")
    held = _lookup(name)
    if held is None:
        raise ValueError(f"unknown layout {name!r}; registered: {sorted(available_layouts())}")
    return held


def is_builtin(layout: object) -> bool:
    """`layout` is the object of a built-in
    ([`BUILTIN_LAYOUTS`][pcp_fn.protocol.registry.BUILTIN_LAYOUTS]: a registration with
    `replace=True` is not)."""
    name = getattr(layout, "name", None)
    if not isinstance(name, str) or name not in BUILTIN_LAYOUTS:
        return False
    module, attribute = BUILTIN_LAYOUTS[name]
    return getattr(importlib.import_module(module), attribute) is layout


def available_layouts() -> tuple[str, ...]:
    """Names of the available layouts: the built-ins, then the registered ones in order."""
    return tuple(dict.fromkeys([*BUILTIN_LAYOUTS, *_REGISTRY]))
