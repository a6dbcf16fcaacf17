"""Capture a PCP function once per bucket and replay it: CUDA graphs, Ascend ACL graphs, or compile.

    captured = pcp_fn.graph.capture(pcp_fn.step, state, batch, slot_mapping)
    state, out = captured(state, next_batch, next_slot_mapping)   # replay

Backends, chosen from the device of the example's tensors and `backend`:

- `cuda`: `torch.cuda.CUDAGraph`. Every tensor leaf of the arguments gets a
  static buffer; a call `copy_`\\ s the new leaves into them and replays.
- `npu`: `torch.npu.NPUGraph` from `torch_npu` (imported only then), the
  same way.
- `backend="aoti"` (any device AOTInductor compiles for; the CPU's fast
  path): per signature, `torch.export` of the function over its flattened
  tensor leaves, `aoti_compile_and_package` into `package_dir`, and
  `aoti_load_package`; a call runs the loaded model on the leaves and
  rebuilds the result tree. No Dynamo guards, no Python wrapper per graph.
- anything else (the CPU): `torch.compile(fullgraph=True, dynamic=False)`,
  one compiled graph per bucket (`backend="inductor"` unless told).

On the CPU both inductor paths compile a graph of index maps alone to scalar
C++ and one that moves floating-point rows to vectorised C++
([`inductor_options`][pcp_fn.graph.inductor_options]; `inductor_options=` chooses instead).

[`compile_per_bucket`][pcp_fn.graph.compile_per_bucket] takes the compile path on every device: one
`torch.compile` per signature, each under its own code object, so Dynamo
keeps one cache entry per code object and a function serving any number of
buckets compiles exactly one graph per bucket within torch's default
recompile limit (`torch._dynamo.config.recompile_limit`, left untouched).

A call finds its graph by one walk over the arguments
([`pcp_fn.graph.flat.flatten`][]: structure, static fields, leaf shapes,
dtypes and devices) and one dict lookup; the capacity and config checks run
when a signature is first seen.

Entry ops ([`pcp_fn.core.entry.entry_op`][]: `update_tokens`, `step`,
`spec_step`, MRV2 `partition_batch`...) read only the config and rank of
the state they are given, so for them the state is keyed by its config and
rank alone: a state coming out of any step, built for any bucket, replays the
graph of the new batch's bucket. Other functions are keyed by every argument.

One graph per *signature*: the tree structure of the arguments (configs and
buckets are static parts of it) plus every tensor leaf's shape and dtype. A
call with a new signature captures a new graph on first use (`grow=True`) or
raises [`CaptureError`][pcp_fn.graph.CaptureError] (`grow=False`: only what was captured up front,
with [`Captured.capture`][pcp_fn.graph.Captured.capture], is served). A batch whose bucket exceeds the
capacities of the state's config, or a state of another config, always raises
[`CaptureError`][pcp_fn.graph.CaptureError]; the captured callable stays usable afterwards.

Output rule (graph backends): a replay returns the graph's own output tensors.
They stay valid until the next replay *of the same graph* (the same bucket),
which overwrites them in place; each graph has its own memory pool, so a
replay of another bucket leaves them alone. Clone what must outlive that. On
the compile backend every call returns fresh tensors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import tempfile
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..core.buckets import Bucket
from ..core.entry import is_entry_op
from .errors import CaptureError
from .export import export
from .flat import Rebuild, flatten


def _device_of(leaves: list[Any]) -> torch.device:
    devices = {x.device for x in leaves if isinstance(x, torch.Tensor)}
    if len(devices) != 1:
        raise CaptureError(
            f"capture needs every tensor argument on one device, got {sorted(map(str, devices))}"
        )
    return devices.pop()


def _is_state(x: Any) -> bool:
    """A layout state (`PCPState`, `mrv2.MRV2State`): it lists the fields entry ops read
    (a batch carries its config too, but no entry fields)."""
    return hasattr(type(x), "ENTRY_FIELDS") and hasattr(x, "config")


def _is_batch(x: Any) -> bool:
    """A batch (`SchedulerBatch`, `mrv2.GlobalBatch`): it carries its bucket."""
    return isinstance(getattr(x, "bucket", None), Bucket) and not _is_state(x)


def _nodes(args: tuple[Any, ...]) -> list[Any]:
    return pytree.tree_flatten(args, is_leaf=lambda x: _is_state(x) or _is_batch(x))[0]


def _configs(args: tuple[Any, ...]) -> list[Any]:
    return [x.config for x in _nodes(args) if _is_state(x)]


def _check_fits(args: tuple[Any, ...], configs: list[Any]) -> None:
    """Every state has the captured config; every batch fits that config's capacity."""
    nodes = _nodes(args)
    states = [x.config for x in nodes if _is_state(x)]
    if states != configs:
        raise CaptureError(
            f"the arguments' configs {states} differ from the captured ones {configs}; "
            "capture again for another config"
        )
    for batch in (x for x in nodes if _is_batch(x)):
        for cfg in configs:
            cap = cfg.capacity
            if batch.bucket.num_reqs > cap.num_reqs or batch.bucket.num_tokens > cap.num_tokens:
                raise CaptureError(
                    f"batch bucket {batch.bucket} exceeds the captured capacity {cap} "
                    "(request rows, local tokens per rank)"
                )
            # a batch records the (rank-free) config it was validated for: another group's batch
            # would replay silently when its bucket happens to fit
            made_for = getattr(batch, "config", None)
            if made_for is not None and made_for != getattr(cfg, "shared", made_for):
                raise CaptureError(
                    f"the batch was built for {made_for}, the captured config is {cfg} (ranks aside)"
                )


def _fresh_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A trampoline with its own code object, so Dynamo keeps a separate cache per graph
    (and never hits its recompile limit however many buckets are served)."""

    def trampoline(*args: Any) -> Any:
        return fn(*args)

    return types.FunctionType(
        trampoline.__code__.replace(), trampoline.__globals__, "pcp_fn_graph", None, trampoline.__closure__
    )


def inductor_options(args: tuple[Any, ...], device: torch.device) -> dict[str, Any]:
    """Inductor options of a graph over `args` on `device` (`{}`: inductor's defaults).

    On the CPU, a graph of index maps only (no floating-point tensor among its
    arguments: every bookkeeping op) is compiled to scalar C++
    (`cpp.simdlen=1`). Its kernels are table lookups at computed indices,
    which inductor's vectorised C++ does a lane at a time through a stack
    buffer (a store and a reload per lookup); plain scalar loops are faster on
    one thread: AOTInductor `step` 99 -> 74 us, `update_tokens` 101 -> 70,
    `attention_metadata` 210 -> 144, MRV2 `partition_batch` 324 -> 160
    (`P = 8`, `P * L_b = 8192`). A graph that moves floating-point rows (a
    hidden-state restore) keeps the vectorised code, which copies those rows
    5x faster than scalar loops.
    """
    if device.type != "cpu":
        return {}
    leaves = pytree.tree_leaves(args)
    if any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in leaves):
        return {}
    return {"cpp.simdlen": 1}


def _scalar_isa_note(record: logging.LogRecord) -> bool:
    """Drops the loader's warning that a scalar package (`cpp.simdlen=1`: no vector ISA, so
    `INVALID_VEC_ISA`) differs from this CPU's ISA: scalar code runs on any CPU."""
    args = record.args if isinstance(record.args, tuple) else ()
    return not (len(args) == 3 and args[0] == "AOTI_CPU_ISA" and args[2] == "INVALID_VEC_ISA")


def _compile_backend(backend: str | None) -> Any:
    """`backend`, or for `None` torch.compile's default backend, as torch 2.13+ reads
    `backend=None` (`torch._dynamo.backends.registry.get_default_backend()`: `"inductor"` unless
    `set_default_backend` chose another). torch 2.10's `torch.compile` has no such default: it takes
    `None` for a compiler function and fails at the first compile (`'NoneType' object is not
    callable`); there the default is `"inductor"`."""
    if backend is not None:
        return backend
    from torch._dynamo.backends import registry

    get_default = getattr(registry, "get_default_backend", None)  # absent in torch 2.10
    return "inductor" if get_default is None else get_default()


class _CompiledGraph:
    def __init__(
        self, fn: Callable[..., Any], backend: str | None, args: tuple[Any, ...], options: dict
    ) -> None:
        backend = _compile_backend(backend)
        extra = {"options": options} if options and backend == "inductor" else {}
        self._fn = torch.compile(_fresh_code(fn), fullgraph=True, dynamic=False, backend=backend, **extra)
        self._fn(*args)  # compile now: capture up front means no compile later

    def __call__(self, args: tuple[Any, ...], leaves: list[Any]) -> Any:
        return self._fn(*args)


class _AOTIGraph:
    """One AOTInductor package: `fn` exported over the tensor leaves of `args`.

    With `reuse`, a package already at `path` is loaded instead of compiled (the
    caller's `path` names everything the program depends on); a new one is written
    under an exclusive lock, so processes sharing `path` compile it once.
    """

    def __init__(
        self, fn: Callable[..., Any], args: tuple[Any, ...], path: str, options: dict, reuse: bool = False
    ) -> None:
        leaves, spec = pytree.tree_flatten(args)
        self._tensors = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        fixed = list(leaves)

        def over_leaves(*tensors: torch.Tensor) -> tuple[Any, ...]:
            full = list(fixed)
            for i, t in zip(self._tensors, tensors):
                full[i] = t
            return tuple(flatten(fn(*pytree.tree_unflatten(full, spec)))[0])

        example = fn(*args)
        self._rebuild = Rebuild(example)
        self.compiled = False
        with _package_lock(path) if reuse else contextlib.nullcontext():
            if not (reuse and os.path.exists(path)):
                program = export(over_leaves, *[leaves[i] for i in self._tensors])
                root, ext = os.path.splitext(path)  # aoti wants the .pt2 suffix
                tmp = f"{root}.{os.getpid()}.tmp{ext}"
                torch._inductor.aoti_compile_and_package(program, package_path=tmp, inductor_configs=options)
                os.replace(tmp, path)  # readers never see a partial package
                self.compiled = True
        package_log = logging.getLogger("torch.export.pt2_archive._package")
        package_log.addFilter(_scalar_isa_note)
        try:
            self._run = torch._inductor.aoti_load_package(path).loader.run
        finally:
            package_log.removeFilter(_scalar_isa_note)
        if flatten(args)[0] != leaves:  # the fast walk and torch's pytree agree on the order
            raise CaptureError("the arguments flatten differently from torch.utils._pytree")

    def __call__(self, args: tuple[Any, ...], leaves: list[Any]) -> Any:
        return self._rebuild(self._run([leaves[i] for i in self._tensors]))


@contextlib.contextmanager
def _package_lock(path: str) -> Any:
    """An exclusive `flock` on `path + ".lock"` (POSIX; elsewhere no lock)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(path + ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class StaticInputs:
    """The static buffers a device graph reads, refreshed from each call's leaves.

    - A leaf that is the very tensor the last call passed, unmodified since
      (same object, same version counter), is not copied again: an entry op's
      state fields that come from its template, and the constant tables a
      state hands on from step to step, cost nothing after the first replay.
    - Leaves that are views of one buffer (a batch from `make_batch`: slots,
      counts and `num_reqs` packed back to back) get static views of one
      buffer laid out alike, and are refreshed by ONE copy of the whole span
      whenever the new leaves are packed the same way (else leaf by leaf).

    So a replay costs one copy of the batch and the graph launch.

    With `in_place` the leaves themselves are the static buffers (the caller's
    persistent staging tensors): a call passing those very tensors copies nothing.
    """

    def __init__(self, leaves: list[Any], in_place: bool = False) -> None:
        self.buffers: list[Any] = list(leaves)
        self._seen: list[tuple[torch.Tensor, int] | None] = [None] * len(leaves)
        self._packs: list[tuple[list[int], list[int], torch.Tensor]] = []  # (leaves, byte offsets, span)
        self._in_pack: set[int] = set()
        if in_place:
            return
        by_storage: dict[int, list[int]] = {}
        for i, x in enumerate(leaves):
            if isinstance(x, torch.Tensor):
                by_storage.setdefault(x.untyped_storage().data_ptr(), []).append(i)
        for group in by_storage.values():
            pack = _packed(leaves, group) if len(group) > 1 else None
            if pack is None:
                for i in group:
                    self.buffers[i] = leaves[i].clone()
                continue
            offsets, span = pack
            static = span.clone()
            for i, off in zip(group, offsets):
                x = leaves[i]
                self.buffers[i] = _view_of(static, off, x)
            self._packs.append((group, offsets, static))
        self._in_pack = {i for group, _, _ in self._packs for i in group}

    def update(self, leaves: list[Any]) -> int:
        """Copy what changed into the buffers; returns the number of copies made."""
        copies = 0
        for group, offsets, static in self._packs:
            if all(self._unchanged(i, leaves[i]) for i in group):
                continue
            pack = _packed(leaves, group)
            if pack is not None and pack[0] == offsets and pack[1].numel() == static.numel():
                static.copy_(pack[1])
                copies += 1
            else:  # packed differently this time: leaf by leaf
                for i in group:
                    self.buffers[i].copy_(leaves[i])
                copies += len(group)
            for i in group:
                self._seen[i] = (leaves[i], leaves[i]._version)
        for i, (dst, src) in enumerate(zip(self.buffers, leaves)):
            if dst is src or not isinstance(dst, torch.Tensor) or i in self._in_pack:
                continue  # (a leaf that is its own static buffer: nothing to copy)
            if self._unchanged(i, src):
                continue
            dst.copy_(src)
            self._seen[i] = (src, src._version)
            copies += 1
        return copies

    def _unchanged(self, i: int, src: torch.Tensor) -> bool:
        seen = self._seen[i]
        return seen is not None and seen[0] is src and seen[1] == src._version


def _packed(leaves: list[Any], group: list[int]) -> tuple[list[int], torch.Tensor] | None:
    """`(byte offsets from the span's start, the span as uint8)` when the `group`'s leaves
    are contiguous views of one storage, else `None`."""
    xs = [leaves[i] for i in group]
    storage = xs[0].untyped_storage()
    if any(not x.is_contiguous() or x.untyped_storage().data_ptr() != storage.data_ptr() for x in xs):
        return None
    starts = [x.storage_offset() * x.element_size() for x in xs]
    first = min(starts)
    end = max(s + x.numel() * x.element_size() for s, x in zip(starts, xs))
    if any((s - first) % x.element_size() for s, x in zip(starts, xs)):
        return None
    span = torch.empty(0, dtype=torch.uint8, device=xs[0].device).set_(storage, first, (end - first,), (1,))
    return [s - first for s in starts], span


def _view_of(span: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A tensor shaped like `like` at byte `offset` of the uint8 `span`."""
    out = torch.empty(0, dtype=like.dtype, device=span.device)
    return out.set_(span.untyped_storage(), offset // like.element_size(), like.shape, like.stride())


class _DeviceGraph:
    """A CUDA or NPU graph with static input buffers for every tensor leaf."""

    def __init__(
        self,
        fn: Callable[..., Any],
        device: torch.device,
        args: tuple[Any, ...],
        warmup: int,
        in_place: bool = False,
    ) -> None:
        if device.type == "npu":
            import torch_npu  # noqa: F401  (registers torch.npu)

            mod, graph_cls = torch.npu, torch.npu.NPUGraph
        else:
            mod, graph_cls = torch.cuda, torch.cuda.CUDAGraph
        leaves, spec = pytree.tree_flatten(args)
        self._inputs = StaticInputs(leaves, in_place)
        static_args = pytree.tree_unflatten(self._inputs.buffers, spec)
        side = mod.Stream(device=device)
        side.wait_stream(mod.current_stream(device))
        with mod.stream(side):
            for _ in range(warmup):  # lazy initialisation happens outside the capture
                fn(*static_args)
        mod.current_stream(device).wait_stream(side)
        self._graph = graph_cls()
        with mod.graph(self._graph):
            self._out = fn(*static_args)

    def __call__(self, args: tuple[Any, ...], leaves: list[Any]) -> Any:
        self._inputs.update(leaves)
        self._graph.replay()
        return self._out


class Captured:
    """A callable with `fn`'s signature that replays one captured graph per signature."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        grow: bool = True,
        backend: str | None = "inductor",
        warmup: int = 2,
        compile_only: bool = False,
        package_dir: str | None = None,
        package_path: str | None = None,
        inductor_options: dict[str, Any] | None = None,
        persistent_inputs: bool = False,
    ) -> None:
        self.fn = fn
        self.persistent_inputs = persistent_inputs
        self.package_path = package_path
        self.inductor_options = inductor_options
        self.grow = grow
        self.backend = backend
        self.warmup = warmup
        self.compile_only = compile_only
        self.package_dir = package_dir
        self._graphs: dict[tuple[Any, ...], Any] = {}
        self._configs: list[Any] | None = None
        self._device: torch.device | None = None
        self._entry = is_entry_op(fn)
        self._templates: dict[tuple[Any, ...], Any] = {}
        self._memo: dict[int, Any] = {}  # flatten's by-identity memo (states passed again)

    def __len__(self) -> int:
        return len(self._graphs)

    @property
    def kind(self) -> str:
        """`"cuda-graph"`, `"npu-graph"`, `"aoti"` or `"compile"` (set by the first capture)."""
        if self._device is None:
            return "unset"
        if self._device.type in ("cuda", "npu") and self.backend != "aoti" and not self.compile_only:
            return {"cuda": "cuda-graph", "npu": "npu-graph"}[self._device.type]
        return "aoti" if self.backend == "aoti" else "compile"

    def entry_args(self, *args: Any) -> tuple[Any, ...]:
        """The arguments a call with `args` runs `fn` on (and a graph replays from).

        For an entry op ([`pcp_fn.core.entry.entry_op`][]) each state becomes the first state
        this object saw of its config and rank kind, the template, with this call's entry fields
        (rank, constants): the template itself when those are its own objects (a state handing
        its constants on, step after step), so a replay copies none of them again. Any other
        argument, and every argument of another op, is passed as it is.
        """
        return self._as_entry(args)

    def _as_entry(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """For an entry op: each state argument becomes the first state seen of its
        config and rank kind, with this call's entry fields (rank, constants).

        The entry fields usually are the template's own objects (a state passes its
        constants on, step after step): then the template itself is the argument.
        """
        if not self._entry:
            return args
        out = []
        for arg in args:
            if _is_state(arg):
                key = (type(arg), arg.config, arg.rank is None)
                template = self._templates.setdefault(key, arg)
                fields = type(arg).ENTRY_FIELDS
                if all(_same(getattr(arg, f), getattr(template, f)) for f in fields):
                    arg = template
                else:
                    arg = dataclasses.replace(template, **{f: getattr(arg, f) for f in fields})
            out.append(arg)
        return tuple(out)

    def _first_sight(self, args: tuple[Any, ...], leaves: list[Any]) -> None:
        """The checks a signature gets once: one device, the captured configs, capacities."""
        device = _device_of(leaves)
        configs = _configs(args)
        if self._configs is None:
            self._configs, self._device = configs, device
        _check_fits(args, self._configs)
        if device != self._device:
            raise CaptureError(f"arguments are on {device}, the graphs on {self._device}")

    def capture(self, *args: Any) -> None:
        """Capture the graph for `args`' signature now (no-op when it exists)."""
        args = self._as_entry(args)
        leaves, sig = flatten(args)
        if sig not in self._graphs:
            self._first_sight(args, leaves)
            self._graphs[sig] = self._build(args)

    def _build(self, args: tuple[Any, ...]) -> Any:
        assert self._device is not None
        if self.backend == "aoti":
            if self.package_path is not None and not self._graphs:
                os.makedirs(os.path.dirname(os.path.abspath(self.package_path)), exist_ok=True)
                return _AOTIGraph(self.fn, args, self.package_path, self._options(args), reuse=True)
            if self.package_dir is None:
                self.package_dir = tempfile.mkdtemp(prefix="pcp_fn_aoti_")
            os.makedirs(self.package_dir, exist_ok=True)
            name = getattr(self.fn, "__name__", "fn")
            path = os.path.join(self.package_dir, f"{name}_{len(self._graphs)}_{os.getpid()}.pt2")
            return _AOTIGraph(self.fn, args, path, self._options(args))
        if self._device.type in ("cuda", "npu") and not self.compile_only:
            return _DeviceGraph(self.fn, self._device, args, self.warmup, self.persistent_inputs)
        return _CompiledGraph(self.fn, self.backend, args, self._options(args))

    def _options(self, args: tuple[Any, ...]) -> dict[str, Any]:
        assert self._device is not None
        if self.inductor_options is not None:
            return dict(self.inductor_options)
        return inductor_options(args, self._device)

    def _graph_for(self, args: tuple[Any, ...]) -> tuple[Any, list[Any]]:
        leaves, sig = flatten(args, self._memo)
        graph = self._graphs.get(sig)
        if graph is None:
            self._first_sight(args, leaves)
            if not self.grow:
                raise CaptureError(
                    f"no graph was captured for these arguments ({_describe(args)}); "
                    f"{len(self._graphs)} captured up front and grow=False"
                )
            graph = self._graphs[sig] = self._build(args)
        return graph, leaves

    def __call__(self, *args: Any) -> Any:
        args = self._as_entry(args)
        graph, leaves = self._graph_for(args)
        return graph(args, leaves)

    def bind(self, *args: Any) -> Callable[[], Any]:
        """A zero-argument callable replaying the graph of `args` on these very objects.

        The signature lookup and the checks of a call run once, here (capturing
        the graph now if it is missing and `grow` allows it), so each call of
        the result costs the replay alone: for a caller that stages every step's
        inputs into the same persistent tensors. Each call reads the tensors'
        current contents (a device graph copies them into its static inputs, as
        a call does); their shapes, dtypes and devices must stay as they are,
        which the bound call does not check again. Returns what a call returns.
        """
        args = self._as_entry(args)
        graph, leaves = self._graph_for(args)
        return functools.partial(graph, args, leaves)


def _same(a: Any, b: Any) -> bool:
    """The same objects, or dicts of the same objects (a state's constants rebuilt around the
    very tensors a graph passed through)."""
    if a is b:
        return True
    return (
        type(a) is dict and type(b) is dict and a.keys() == b.keys() and all(v is b[k] for k, v in a.items())
    )


def _describe(args: tuple[Any, ...]) -> str:
    buckets = [x.bucket for x in _nodes(args) if _is_batch(x)]
    return f"bucket {buckets[0]}" if len(buckets) == 1 else "a new signature"


def capture(
    fn: Callable[..., Any],
    *example_args: Any,
    grow: bool = True,
    backend: str | None = "inductor",
    warmup: int = 2,
    package_dir: str | None = None,
    package_path: str | None = None,
    inductor_options: dict[str, Any] | None = None,
    persistent_inputs: bool = False,
) -> Captured:
    """Capture `fn(*example_args)` into a graph now and return the replaying callable.

    Args:
        grow: capture new buckets on first use (default) or raise
            [`CaptureError`][pcp_fn.graph.CaptureError] for anything not captured up front.
        backend: `"aoti"` (AOTInductor, one package per signature), or the
            `torch.compile` backend of the compile path (CPU; `None`: torch.compile's
            default backend, `"inductor"` unless set otherwise, on every torch release).
        warmup: eager runs before a CUDA/NPU capture.
        package_dir: where `backend="aoti"` writes its `.pt2` packages
            (default: a new temporary directory).
        package_path: `backend="aoti"`: the package file of the example's
            signature, loaded if it exists (compiled and written there
            otherwise, under a lock: processes sharing it compile once). The
            caller names it by everything the program depends on (a disk
            cache); other signatures go to `package_dir`.
        inductor_options: inductor config of the compiled graphs (`backend="aoti"`
            or `"inductor"`); default [`inductor_options`][pcp_fn.graph.inductor_options] of the arguments.
        persistent_inputs: the example's tensors are persistent buffers that calls
            pass again with new contents (a caller staging each step in place, then
            replaying [`Captured.bind`][pcp_fn.graph.Captured.bind]): a CUDA/NPU graph reads them where they
            are, with no static copies and no copy per replay (a call with other
            tensors still copies them in). Other backends read their arguments anyway.
    """
    captured = Captured(
        fn,
        grow=grow,
        backend=backend,
        warmup=warmup,
        package_dir=package_dir,
        package_path=package_path,
        inductor_options=inductor_options,
        persistent_inputs=persistent_inputs,
    )
    captured.capture(*example_args)
    return captured


def compile_per_bucket(fn: Callable[..., Any], *, backend: str = "inductor", grow: bool = True) -> Captured:
    """`torch.compile(fn, fullgraph=True, dynamic=False)`, one graph per bucket, on any device.

    The returned [`Captured`][pcp_fn.graph.Captured] compiles a graph the first time it sees a
    signature (the arguments' tree structure, which holds the configs and
    buckets, plus every tensor leaf's shape and dtype), each under its own code
    object: Dynamo's recompile limit counts graphs per code object, so any
    number of buckets compiles without raising it and without a recompile.
    With bucket-shaped inputs (`make_batch(..., slot_mapping=...)`) and an
    entry op keyed by its batch alone ([`pcp_fn.core.entry.entry_op`][]), a
    run compiles exactly as many graphs as it meets buckets, `len(result)`;
    a state with its rank as data (`init_state(cfg, rank=r)`) shares them
    across ranks. Unlike [`capture`][pcp_fn.graph.capture.capture] it never records a CUDA/NPU graph,
    and compiles lazily (nothing up front).

        compiled = compile_per_bucket(pcp_fn.step, backend="eager")
        state, out = compiled(state, batch)      # compiles batch.bucket's graph once
    """
    return Captured(fn, grow=grow, backend=backend, compile_only=True)
