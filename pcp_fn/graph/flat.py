"""Fast flattening of PCP arguments and results: what a replay costs on the host besides the graph.

`torch.utils._pytree` is generic and slow (~8 us to flatten a `(PCPState,
SchedulerBatch)`, ~20 us to rebuild a step's outputs, ~100 us for the checks
`graph.capture` layered on it). A captured step runs in tens of
microseconds, so [`pcp_fn.graph.Captured`][] keys and rebuilds with these
instead: [`flatten`][pcp_fn.graph.flat.flatten] walks tuples, lists, dicts and the package's pytree
dataclasses (their field lists are cached on the class by
[`pcp_fn.core.pytree.pytree_dataclass`][]) and hands anything else to
`torch.utils._pytree`; [`Rebuild`][pcp_fn.graph.flat.Rebuild] turns a flat list of leaves back into
the tree of an example, with the dataclasses built field by field.

    leaves, key = flatten((state, batch))   # key: hashable, equal for calls one graph serves
    rebuild = Rebuild(example_output)
    out = rebuild(leaves_of_the_next_output)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

Tensor = torch.Tensor


def flatten(tree: Any, memo: dict[int, Any] | None = None) -> tuple[list[Any], tuple[Any, ...]]:
    """`(leaves, key)`: the tensor (and other) leaves in `torch.utils._pytree` order, and
    a hashable key of everything a graph specialises on: the structure, static fields
    (configs, buckets), and each tensor's shape, dtype and device.

    `memo` (a dict the caller keeps) remembers the leaves and key of each
    dataclass object walked, by identity: frozen objects passed again (a state
    handed from step to step) cost one lookup. It holds them alive; keep it small.
    """
    leaves: list[Any] = []
    key: list[Any] = []
    _walk(tree, leaves, key, memo)
    return leaves, tuple(key)


def _walk(x: Any, leaves: list[Any], key: list[Any], memo: dict[int, Any] | None) -> None:
    t = type(x)
    if t is Tensor or isinstance(x, Tensor):
        leaves.append(x)
        key.append((x.shape, x.dtype, x.device))
    elif x is None:
        leaves.append(None)
        key.append(None)
    elif t is tuple or t is list:
        key.append((t, len(x)))
        for y in x:
            _walk(y, leaves, key, memo)
    elif t is dict:
        key.append((dict, tuple(x)))
        for y in x.values():
            _walk(y, leaves, key, memo)
    elif hasattr(t, "__pytree_children__"):
        seen = None if memo is None else memo.get(id(x))
        if seen is not None and seen[0] is x:
            leaves.extend(seen[1])
            key.extend(seen[2])
            return
        mine: list[Any] = []
        mykey: list[Any] = [(t, tuple([getattr(x, n) for n in t.__pytree_static__]))]
        for n in t.__pytree_children__:
            _walk(getattr(x, n), mine, mykey, memo)
        if memo is not None:
            if len(memo) >= 32:
                memo.clear()
            memo[id(x)] = (x, mine, mykey)
        leaves.extend(mine)
        key.extend(mykey)
    else:  # anything else: the generic pytree (a Python scalar is a leaf keyed by its value)
        sub, spec = pytree.tree_flatten(x)
        key.append(spec)
        for y in sub:
            if isinstance(y, Tensor):
                leaves.append(y)
                key.append((y.shape, y.dtype, y.device))
            else:
                leaves.append(y)
                key.append(("V", type(y), y))


class Rebuild:
    """Rebuilds trees shaped like `example` from their flat leaves
    ([`flatten`][pcp_fn.graph.flat.flatten]'s order).

    The builder is generated once per structure as straight-line Python: each
    dataclass is made with one `__dict__` assignment (no `__init__`, no
    per-field `__setattr__`), each leaf is one indexing.
    """

    def __init__(self, example: Any) -> None:
        env: dict[str, Any] = {"_new": object.__new__, "_set": object.__setattr__, "_pytree": pytree}
        lines: list[str] = []
        expr, count = _emit(example, 0, env, lines)
        body = "\n".join(f"    {line}" for line in [*lines, f"return {expr}"])
        exec(compile(f"def build(L):\n{body}\n", "<pcp_fn.graph.flat.Rebuild>", "exec"), env)
        self._build = env["build"]
        self.num_leaves = count

    def __call__(self, leaves: list[Any] | tuple[Any, ...]) -> Any:
        if len(leaves) != self.num_leaves:
            raise ValueError(f"expected {self.num_leaves} leaves, got {len(leaves)}")
        return self._build(leaves)


def _emit(x: Any, at: int, env: dict[str, Any], lines: list[str]) -> tuple[str, int]:
    """Source of an expression building `x`'s structure from the leaves `L[at:]`, and
    the position after it; objects are made by statements appended to `lines`."""
    t = type(x)
    if t is Tensor or isinstance(x, Tensor) or x is None:
        return f"L[{at}]", at + 1
    if t is tuple or t is list:
        parts = []
        for child in x:
            part, at = _emit(child, at, env, lines)
            parts.append(part)
        inner = ", ".join(parts)
        return (f"({inner},)" if t is tuple else f"[{inner}]"), at
    if t is dict:
        parts = []
        for name, child in x.items():
            part, at = _emit(child, at, env, lines)
            key = f"_k{len(env)}"
            env[key] = name
            parts.append(f"{key}: {part}")
        return "{" + ", ".join(parts) + "}", at
    if hasattr(t, "__pytree_children__"):
        parts = []
        for name in t.__pytree_static__:
            const = f"_s{len(env)}"
            env[const] = getattr(x, name)
            parts.append(f"{name!r}: {const}")
        for name in t.__pytree_children__:
            part, at = _emit(getattr(x, name), at, env, lines)
            parts.append(f"{name!r}: {part}")
        cls, obj = f"_t{len(env)}", f"o{len(lines)}"
        env[cls] = t
        fields = "{" + ", ".join(parts) + "}"
        if hasattr(t, "__post_init__"):  # a class that checks its fields: through __init__
            lines.append(f"{obj} = {cls}(**{fields})")
        else:  # a frozen dataclass: its __dict__ in one assignment
            lines.append(f"{obj} = _new({cls}); _set({obj}, '__dict__', {fields})")
        return obj, at
    sub, spec = pytree.tree_flatten(x)
    name = f"_spec{len(env)}"
    env[name] = spec
    return f"_pytree.tree_unflatten(list(L[{at}:{at + len(sub)}]), {name})", at + len(sub)
