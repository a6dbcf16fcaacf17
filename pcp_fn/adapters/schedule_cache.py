"""What a repeated schedule reuses: one cache per manager, one bound, one invalidation rule.

A serving engine's steps repeat themselves: a busy server's decode steps have
the same schedule (every request one token, none prefilling) step after step,
and a step's padded sizes take a handful of values. The host work that only the
schedule decides (the host twin's segments, the step's shape and plan, the
views of the persistent buffers at its sizes) is made once and looked up after.

All of it lives in one [`ScheduleCache`][pcp_fn.adapters.schedule_cache.ScheduleCache], in named tables:

| table           | key                                              | value                |
|-----------------|--------------------------------------------------|----------------------|
| `segments`      | the schedule: `num_scheduled_tokens` and         | the host twin's      |
|                 | `is_prefilling` (dtype and bytes)                | segments, the widest |
|                 |                                                  | rank's tokens        |
| `descriptors`   | what a batch descriptor says of the sizes        | a small id           |
| `shapes`        | the schedule and the descriptor's id             | the step's shape     |
| `views`         | the step's sizes `(Lp, Rpad, n, rows)`           | plan, device views   |
| `plans`         | `(Lp, Rpad, rows)`                               | the bookkeeping plan |
| `states`        | `Lp`                                             | the consumers' state |
| `input_ids` ... | a row count (`input_ids`, `positions`,         a | buffer's prefix      |
|                 | `restore`)                                       |                      |
| `contexts`      | vllm-ascend V2: the attention context's sizes    | views of the buffers |

**Bound**: [`ScheduleCache.max_entries`][pcp_fn.adapters.schedule_cache.ScheduleCache] entries in
all the tables together; the entry that would pass it clears every table first (a server
repeats a few schedules; after a clear each is made once more). **Invalidation**:
[`ScheduleCache.clear`][pcp_fn.adapters.schedule_cache.ScheduleCache.clear] whenever what the
entries hold changes (the manager's block tables and slot-mapping buffers are replaced, or its
layout
rules: `set_block_tables`). Nothing else removes an entry.

A hit is one `dict.get` on a table the owner holds
([`table`][pcp_fn.adapters.schedule_cache.ScheduleCache.table]); a miss goes through
[`put`][pcp_fn.adapters.schedule_cache.ScheduleCache.put], which keeps the bound.
[`made`][pcp_fn.adapters.schedule_cache.ScheduleCache] counts the misses by table (what a test
checks to see that a repeated schedule recomputes nothing).
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import Any, TypeVar

V = TypeVar("V")


class ScheduleCache:
    """The tables of one manager's reusable host work (see the module docstring).

    Args:
        max_entries: the bound on the entries of all tables together.
    """

    def __init__(self, max_entries: int = 4096) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._tables: dict[str, dict[Hashable, Any]] = {}
        self._size = 0
        self.made: collections.Counter[str] = collections.Counter()
        self.clears = 0

    def table(self, name: str) -> dict[Hashable, Any]:
        """The table `name` (made on first use): read it with `.get`, write it with
        [`put`][pcp_fn.adapters.schedule_cache.ScheduleCache.put]."""
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = {}
        return table

    def put(self, name: str, key: Hashable, value: V) -> V:
        """Store `value` under `key` in table `name` and return it; when the cache is full,
        every table is cleared first."""
        table = self._tables[name]
        if key not in table:
            if self._size >= self.max_entries:
                self._clear_tables()
            self._size += 1
        table[key] = value
        self.made[name] += 1
        return value

    def forget(self, *names: str) -> None:
        """Drop the entries of the tables `names` only (a benchmark timing a new schedule's
        host work forgets the schedule's tables and keeps the size-keyed views)."""
        for name in names:
            table = self._tables.get(name)
            if table is not None:
                self._size -= len(table)
                table.clear()

    def clear(self) -> None:
        """Drop every entry (what they hold changed: new buffers, new layout rules)."""
        self._clear_tables()

    def _clear_tables(self) -> None:
        for table in self._tables.values():
            table.clear()  # the owners hold the tables: clear them in place
        self._size = 0
        self.clears += 1

    def __len__(self) -> int:
        return self._size
