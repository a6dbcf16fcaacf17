"""`PackageLayout`: a [`pcp_fn.Layout`][] whose methods are a module's functions.

The built-in `"dcs"` ([`pcp_fn.dcs.layout`][]) and `"hybrid"` ([`pcp_fn.hybrid.ops`][])
layouts are plain functions of a state; this class binds them, and the module's optional
`check_config` and `constants` hooks, to one object the registry holds.
"""

from __future__ import annotations

from types import ModuleType

from .registry import PROTOCOL_MEMBERS, get_layout

_HOOKS = ("check_config", "constants")  # optional members of the protocol


class PackageLayout:
    """A [`pcp_fn.Layout`][] served by the functions of `package` (a module, or any object
    holding every protocol member but `name` as an attribute)."""

    def __init__(self, name: str, package: ModuleType) -> None:
        missing = [m for m in PROTOCOL_MEMBERS[1:] if not hasattr(package, m)]
        if missing:
            raise TypeError(f"{package!r} lacks the layout functions {missing}")
        self.name = name
        self.package = package
        # bound once as instance attributes: the facade calls them every step
        for member in PROTOCOL_MEMBERS[1:] + tuple(h for h in _HOOKS if hasattr(package, h)):
            setattr(self, member, getattr(package, member))

    def __repr__(self) -> str:
        return f"PackageLayout({self.name!r}, {getattr(self.package, '__name__', repr(self.package))})"

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return get_layout, (self.name,)  # pickled by name (a config that holds it pickles)
