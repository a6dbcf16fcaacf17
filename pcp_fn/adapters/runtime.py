"""One runtime for every adapter's graphs: made at construction, bound to fixed buffers, replayed.

An adapter (the vLLM MRV2 bookkeeping, vllm-ascend's DualChunkSwap device
graphs) declares each device function of each rung of its ladder as a
[`GraphCall`][pcp_fn.adapters.runtime.GraphCall]: the function, the persistent buffers it writes (`fixed`)
and the staging inputs it reads (`staged`). The runtime then owns what every
adapter needs around them, once:

- [`GraphRuntime.prepare`][pcp_fn.adapters.runtime.GraphRuntime.prepare] (start-up): every call's graph made
  ([`pcp_fn.graph.capture`][pcp_fn.graph.capture.capture]: a CUDA / NPU graph, `torch.compile`, or an
  AOTInductor package loaded from the disk cache when there is one), bound to
  its staging inputs (`Captured.bind`: a replay has no signature lookup) and
  run once, so no step compiles;
- [`GraphRuntime.run`][pcp_fn.adapters.runtime.GraphRuntime.run] (a step): one replay; a call
  without a graph runs eagerly, logged once and counted in `stats.fallbacks`;
- the host-sync guard ([`GraphRuntime.guard`][pcp_fn.adapters.runtime.GraphRuntime.guard], and
  around every plain call), and [`GraphStats`][pcp_fn.adapters.backend.GraphStats].

    runtime = GraphRuntime("inductor", device)
    call = runtime.add(("step", bucket), step_into, fixed=(state, out), staged=(packed,))
    runtime.prepare()      # start-up: one graph per call, bound to `packed`
    ...                    # a step writes `packed` (a [`Staging`][pcp_fn.adapters.runtime.Staging]
    buffer) in place runtime.run(call)      # and replays

With `backend=None` nothing is compiled: [`run`][pcp_fn.adapters.runtime.GraphRuntime.run] makes plain calls.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import numpy as np
import torch

from .. import graph
from ..core.staging import host_buffer, to_device
from .backend import GraphStats, package_name

logger = logging.getLogger("pcp_fn.adapters")

_NO_GUARD = contextlib.nullcontext()  # reusable


@dataclasses.dataclass(eq=False, slots=True)
class GraphCall:
    """One device function of one rung, bound to its buffers (made by
    [`GraphRuntime.add`][pcp_fn.adapters.runtime.GraphRuntime.add]).

    Attributes:
        key: names the call in logs (`("step", bucket)`...).
        fn: `fn(*fixed, *staged)` writes its results into `fixed`'s buffers, returns nothing.
        fixed: the persistent arguments (state, output buffers: pytrees of tensors).
        staged: the staging inputs, the tensors a graph reads at each replay.
        graph_key: calls with one `graph_key` share a graph (they differ in `staged` only);
            it also names the AOTInductor package.
        in_place: the staging inputs are always these tensors: a device graph reads them
            in place (`capture(persistent_inputs=True)`), a replay copies nothing.
        step: a run of this call is a step (counted in `stats.steps`).
        bound: the replay (a bound graph, or the plain call), `None` until made.
        fallback: it runs eagerly although the runtime has a backend (no graph was made).
    """

    key: Hashable
    fn: Callable[..., None]
    fixed: tuple[Any, ...]
    staged: tuple[torch.Tensor, ...]
    graph_key: Hashable
    in_place: bool = True
    step: bool = False
    bound: Callable[[], None] | None = None
    fallback: bool = False

    def plain(self) -> Callable[[], None]:
        """The call without a graph."""
        return functools.partial(self.fn, *self.fixed, *self.staged)


class GraphRuntime:
    """The graphs of one adapter instance.

    Args:
        backend: `None` (plain calls), `"aoti"` (AOTInductor packages), or a
            `torch.compile` backend (device graphs on CUDA / NPU):
            [`pcp_fn.adapters.backend.resolve_graph_backend`][]'s value.
        device: where the graphs run.
        check_host_syncs: run every plain call, and
            [`guard`][pcp_fn.adapters.runtime.GraphRuntime.guard]'s blocks, under
            [`pcp_fn.graph.no_host_syncs`][pcp_fn.no_host_syncs] (a graph was checked when it was
            traced; `torch.compile` refuses to run under the detector).
        package_dir: `backend="aoti"`: a directory caching one package per graph
            ([`package_path`][pcp_fn.adapters.runtime.GraphRuntime.package_path]); `None`: compiled
            into a temporary file each time.
        package_prefix: the first part of the packages' names.
        package_key: the rest of what names the packages (the adapter's config: a package is
            reused only for the same config, graph, device type, torch and pcp_fn sources).
    """

    def __init__(
        self,
        backend: str | None,
        device: torch.device,
        *,
        check_host_syncs: bool = False,
        package_dir: str | None = None,
        package_prefix: str = "graph",
        package_key: tuple[Any, ...] = (),
    ) -> None:
        self.backend, self.device = backend, device
        self.check_host_syncs = check_host_syncs
        self.package_dir, self.package_prefix, self.package_key = package_dir, package_prefix, package_key
        self.stats = GraphStats()
        self.calls: list[GraphCall] = []
        self._captured: dict[Hashable, graph.Captured] = {}
        # Dynamo guards on the grad mode: a torch.compile graph on the CPU is made and replayed
        # under inference mode (plain calls, AOTInductor and device graphs do not care)
        self._needs_mode = backend not in (None, "aoti") and device.type == "cpu"
        self._guard_plain = check_host_syncs and backend is None
        self._bare = not (self._needs_mode or self._guard_plain)

    # ---------------------------------------------------------------- declaring and making

    def add(
        self,
        key: Hashable,
        fn: Callable[..., None],
        *,
        fixed: tuple[Any, ...],
        staged: tuple[torch.Tensor, ...],
        graph_key: Hashable | None = None,
        in_place: bool = True,
        step: bool = False,
    ) -> GraphCall:
        """Declare one call (made by the next
        [`prepare`][pcp_fn.adapters.runtime.GraphRuntime.prepare]; run by
        [`run`][pcp_fn.adapters.runtime.GraphRuntime.run])."""
        call = GraphCall(key, fn, fixed, staged, key if graph_key is None else graph_key, in_place, step)
        self.calls.append(call)
        return call

    def prepare(self, calls: Iterable[GraphCall] | None = None) -> GraphStats:
        """Make the graph of every call not made yet (default: all declared) now, at start-up, and
        run each once on what is staged (the graphs write their persistent buffers: call it
        before serving, not inside a step). A no-op with `backend=None`."""
        if self.backend is None:
            return self.stats
        start = time.perf_counter()
        with self._mode():
            for call in self.calls if calls is None else calls:
                if call.bound is None or call.fallback:
                    call.fallback = False
                    call.bound = self._make(call)
                    call.bound()  # once here: a compiled graph meeting new inputs recompiles now
        self.stats.prepare_seconds += time.perf_counter() - start
        return self.stats

    def _make(self, call: GraphCall) -> Callable[[], None]:
        if self.backend == "aoti":  # every tensor an argument: AOTInductor writes the buffers it is given
            fn, args = call.fn, (*call.fixed, *call.staged)
        else:  # the persistent buffers closed over: a device graph writes them, not static copies
            fn, args = functools.partial(call.fn, *call.fixed), call.staged
        captured = self._captured.get(call.graph_key)
        if captured is None:
            path = None
            if self.backend == "aoti" and self.package_dir is not None:
                path = self.package_path(call.graph_key)
                self.stats.loaded += os.path.exists(path)
            captured = graph.capture(
                fn, *args, backend=self.backend, package_path=path, persistent_inputs=call.in_place
            )
            self._captured[call.graph_key] = captured
            self.stats.prepared += 1
        return captured.bind(*args)

    def package_path(self, graph_key: Hashable) -> str:
        """The AOTInductor package of a graph in `package_dir`, named by all it depends on:
        the adapter's config (`package_key`), the graph, the device type, torch's version and
        pcp_fn's sources."""
        assert self.package_dir is not None
        name = package_name(self.package_prefix, *self.package_key, graph_key, self.device.type)
        return os.path.join(self.package_dir, name)

    @property
    def num_graphs(self) -> int:
        """Graphs made so far (`0` with plain calls)."""
        return len(self._captured)

    # ---------------------------------------------------------------- running

    def run(self, call: GraphCall) -> None:
        """One step's call: its replay, or (no graph made) the plain call, a counted fallback
        when the runtime has a backend (logged once per call)."""
        bound = call.bound
        if bound is None:
            bound = call.bound = call.plain()
            call.fallback = self.backend is not None
            if call.fallback:
                logger.warning(
                    "pcp_fn: no prepared %r graph for %s: it runs eagerly (counted in "
                    "stats.fallbacks); the adapter makes every graph at start-up",
                    self.backend,
                    call.key,
                )
        if call.step:
            self.stats.steps += 1
        if call.fallback:
            self.stats.fallbacks += 1
        self.invoke(call, bound)

    def invoke(self, call: GraphCall, bound: Callable[[], None]) -> None:
        """Call `bound` (`call`'s replay) in the mode it was made in, plain calls under the
        host-sync guard. A benchmark replaces it to model what a device's replay costs."""
        if self._bare:
            bound()
            return
        with self.guard() if self._guard_plain else _NO_GUARD, self._mode():
            bound()

    def _mode(self) -> contextlib.AbstractContextManager[Any]:
        # vLLM steps under inference mode already: entering it again is not free
        if self._needs_mode and not torch.is_inference_mode_enabled():
            return torch.inference_mode()
        return _NO_GUARD

    def guard(self) -> contextlib.AbstractContextManager[Any]:
        """[`pcp_fn.graph.no_host_syncs`][pcp_fn.no_host_syncs] with `check_host_syncs`, else nothing: for the
        adapter's own device work around the graphs (staging copies, gathers)."""
        return graph.no_host_syncs() if self.check_host_syncs else _NO_GUARD


class Staging:
    """A persistent int32 device buffer that graphs read
    ([`device_buffer`][pcp_fn.adapters.runtime.Staging]), written from the host each step.

    On the CPU the host writes the buffer itself: [`host`][pcp_fn.adapters.runtime.Staging.host] is
    its numpy view, the same every step ([`persistent`][pcp_fn.adapters.runtime.Staging]: its words
    stay as the last step left them). Elsewhere [`host`][pcp_fn.adapters.runtime.Staging.host] hands
    out a pinned buffer of the rotation ([`pcp_fn.core.staging.host_buffer`][], uninitialised: the
    caller writes every word) and [`commit`][pcp_fn.adapters.runtime.Staging.commit] copies it into
    the device buffer in one non-blocking copy.
    """

    def __init__(self, numel: int, device: torch.device) -> None:
        self.device_buffer = torch.zeros(numel, dtype=torch.int32, device=device)
        self.persistent = device.type == "cpu"
        self._host = self.device_buffer.numpy() if self.persistent else None

    def host(self) -> np.ndarray:
        """`[numel]` int32: where the host writes this step's words."""
        if self._host is not None:
            return self._host
        return host_buffer(self.device_buffer.shape[0], np.int32, self.device_buffer.device)

    def commit(self, host: np.ndarray) -> None:
        """Move `host` (from [`host`][pcp_fn.adapters.runtime.Staging.host]) into the device buffer
        (nothing to do on the CPU)."""
        if host is not self._host:
            to_device(host, self.device_buffer.device, out=self.device_buffer)
