"""Frozen dataclasses that are torch pytrees (the `flax.struct` idea on torch).

A field marked `static_field()` rides in the tree *structure* (the treespec
context): it must be hashable and is compared by `torch.compile` guards,
`torch.export` input specs and `graph.capture` keys. Every other field is a
child: a tensor, `None` or another pytree. `dataclasses.replace` makes the
next value; nothing is mutated.

    @pytree_dataclass
    class Pair:
        n: int = static_field()
        x: torch.Tensor

    leaves, spec = torch.utils._pytree.tree_flatten(Pair(2, t))   # leaves == [t]
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch.utils._pytree as pytree

T = TypeVar("T")

_STATIC = "pcp_fn_static"


def static_field(**kwargs: Any) -> Any:
    """A dataclass field that is tree structure, not a leaf."""
    metadata = dict(kwargs.pop("metadata", {}) or {})
    metadata[_STATIC] = True
    return dataclasses.field(metadata=metadata, **kwargs)


def pytree_dataclass(cls: type[T]) -> type[T]:
    """Make `cls` a frozen dataclass registered with `torch.utils._pytree`."""
    if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:
        cls = dataclasses.dataclass(frozen=True)(cls)
    fields = dataclasses.fields(cls)
    static = tuple(f.name for f in fields if f.metadata.get(_STATIC, False))
    children = tuple(f.name for f in fields if not f.metadata.get(_STATIC, False))

    def flatten(obj: Any) -> tuple[list[Any], tuple[Any, ...]]:
        return [getattr(obj, n) for n in children], tuple(getattr(obj, n) for n in static)

    def flatten_with_keys(obj: Any) -> tuple[list[tuple[Any, Any]], tuple[Any, ...]]:
        values, context = flatten(obj)
        return [(pytree.GetAttrKey(n), v) for n, v in zip(children, values)], context

    def unflatten(values: Any, context: tuple[Any, ...]) -> Any:
        kwargs = dict(zip(children, values))
        kwargs.update(zip(static, context))
        return cls(**kwargs)

    cls.__pytree_children__ = children  # read by pcp_fn.graph's fast flattening
    cls.__pytree_static__ = static
    pytree.register_pytree_node(
        cls,
        flatten,
        unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=flatten_with_keys,
    )
    return cls
