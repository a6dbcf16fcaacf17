"""`dataclasses.replace` for the batch a manager returns every step, without the per-field loop.

vLLM's `InputBatch` has 36 fields and the local batch is the global one with
about 30 of them replaced; `dataclasses.replace` calls `__init__` with every
field. For a plain dataclass (not frozen, no `__post_init__`, no slots, no
`init=False` field: vLLM's `InputBatch` and vllm-ascend's
`AscendInputBatch`) a copy of `__dict__` with the changes is the same object.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, TypeVar

BatchT = TypeVar("BatchT")  # a dataclass instance: vLLM's InputBatch, vllm-ascend's AscendInputBatch


@functools.cache
def plain_fields(cls: type) -> frozenset[str] | None:
    """The field names of `cls` when `dataclasses.replace` of one is a copy of its
    `__dict__`, else `None`."""
    if not dataclasses.is_dataclass(cls) or "__slots__" in cls.__dict__ or hasattr(cls, "__post_init__"):
        return None
    fields = dataclasses.fields(cls)
    if cls.__dataclass_params__.frozen or not all(f.init for f in fields):  # type: ignore[attr-defined]
        return None
    return frozenset(f.name for f in fields)


def dict_copy_ok(cls: type, *changes: dict[str, Any]) -> bool:
    """Whether [`replace_fields`][pcp_fn.adapters.vllm.replace.replace_fields] of a `cls` with dicts
    of these keys may copy `__dict__`."""
    names = plain_fields(cls)
    return names is not None and all(names.issuperset(c) for c in changes)


def replace_fields(obj: BatchT, *changes: dict[str, Any], checked: bool = False) -> BatchT:
    """`dataclasses.replace(obj, **changes[0], **changes[1], ...)` (later dicts win).

    `checked`: the caller knows [`dict_copy_ok`][pcp_fn.adapters.vllm.replace.dict_copy_ok] holds
    for `type(obj)` and these keys (a caller whose keys are the same every call checks once per
    class). Otherwise an unknown field raises, as `dataclasses.replace` does.
    """
    cls = type(obj)
    if not (checked or dict_copy_ok(cls, *changes)):
        merged: dict[str, Any] = {}
        for c in changes:
            merged.update(c)
        return dataclasses.replace(obj, **merged)
    merged = obj.__dict__.copy()  # one new dict, assigned whole
    for c in changes:
        merged.update(c)
    new = object.__new__(cls)
    new.__dict__ = merged
    return new
