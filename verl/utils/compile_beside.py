"""Compiled code built beside the first eager passes (the plan's `compile_warmup=background`).

torch.compile does its work on a function's first call: tracing, AOTAutograd's split and code
generation, a minute or more on a GPU for a model's decoder layers, its log-prob kernels and the
rollout's decode step, all of it before the first step if the first step runs the compiled code.
Here the first passes run the eager functions instead, and the eager calls hand copies of their
inputs (one per kind of call: grad mode, autocast, the ranks and dtypes of the tensors) to a side
thread, which calls the compiled function on them, with a backward where the call was
differentiable, so that tracing and code generation are finished by the time the compiled code runs.
The side thread starts once every pass of the first step has run: the first step runs alone, as fast
as eager code runs (a one-step run compiles nothing), and every kind of call is known by then.

Eager and compiled code never mix within a pass: calls read which one to run from a flag that only
changes where a pass begins (`pass_`, under a lock, never inside another pass). The flag turns to
compiled at the first pass boundary after every recorded kind has been built and no new kind can
arrive (a pass of a name already seen has begun: the passes of one step have all run once). If
building fails, every call stays eager for the rest of the run and one warning says why.

`synchronous` runs the compiled code from the first call, as torch.compile does by itself.
"""
from __future__ import annotations

import contextlib
import logging
import queue
import sys
import threading
import time
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map

from verl.utils import compile_clock

logger = logging.getLogger(__name__)

MODES = ("background", "synchronous")
# recorded kinds of call kept per function: the passes of a step make at most a few (grad on and off,
# with and without autocast); a bound keeps an unexpected variety from holding many input copies
MAX_KINDS = 4

# The interpreter's thread switch interval while a side thread builds. torch releases the GIL around each
# operator call and the compile, Python from end to end, takes it meanwhile; the training thread then waits
# a whole interval (5 ms by default) to get it back after every operator, and an eager step of thousands of
# operators crawls. At this interval it waits tens of microseconds; the compile pays for the extra switches.
BUILDING_SWITCH_INTERVAL = 2e-5

_building_lock = threading.Lock()
_building = 0   # side threads of this process still building
_builders: set[int] = set()   # their thread ids
_switch_interval = None   # the interpreter's own, kept while side threads build


def _own_compile_flag() -> None:
    """Keep a side thread's compile from showing in the other threads' `torch.compiler.is_compiling()`.

    Newer torch holds that module-wide flag up for a whole compile (for code that runs during the
    compile without being traced), so the training thread's eager code would read "compiling" while
    the side thread compiles: transformers then keeps attention masks it would drop, and the eager
    calls take shapes the steady state never has. Dynamo folds is_compiling() to True in what it
    traces either way; the side thread's compiles (of plain tensors) need no more than that."""
    session = getattr(torch.compiler, "_compile_session_context", None)
    if session is None or getattr(session, "_beside", False):
        return

    @contextlib.contextmanager
    def compile_session():
        if threading.get_ident() in _builders:
            yield
        else:
            with session():
                yield

    compile_session._beside = True
    torch.compiler._compile_session_context = compile_session


def _builder_started() -> None:
    global _building, _switch_interval
    with _building_lock:
        if _building == 0:
            _switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_interval, BUILDING_SWITCH_INTERVAL))
        _building += 1


def _builder_ended() -> None:
    global _building
    with _building_lock:
        _building -= 1
        if _building == 0:
            sys.setswitchinterval(_switch_interval)


def building_beside() -> bool:
    """Whether a side thread of this process is building compiled code. A CUDA graph must not be
    recorded meanwhile: the side thread's kernel launches and allocations would void the capture, so
    the rollout decodes without graphs until the build is done."""
    return _building > 0


class PassInfo:
    """Whether a pass ran compiled code (True, False, or None when it called no switchable function), and
    the seconds torch.compile ran during it (verl/utils/compile_clock.py; None where not counted)."""

    compiled: bool | None = None
    compile_s: float | None = None


class _Example:
    """Copies of one eager call's inputs and the grad and autocast state it ran under."""

    def __init__(self, args: tuple, kwargs: dict):
        self.args, self.kwargs = tree_map(_copy, (args, kwargs))
        self.grad = torch.is_grad_enabled()
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        self.device = tensors[0].device if tensors else torch.device("cpu")
        kind = self.device.type
        self.autocast = (kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))
        self._copied = None   # the stream position after the copies (the side thread runs on its own stream)
        if kind != "cpu":
            self._copied = torch.get_device_module(kind).Event()
            self._copied.record()

    def run(self, fn: Callable) -> None:
        """Call `fn` on the copies as the eager call ran, then its backward if the result needs one
        (gradients taken with autograd.grad: no `.grad` of a live parameter is touched)."""
        device = None if self.device.type == "cpu" else torch.get_device_module(self.device.type)
        if device is not None:
            device.set_device(self.device)
            device.current_stream().wait_event(self._copied)
        kind, enabled, dtype = self.autocast
        with torch.set_grad_enabled(self.grad), torch.autocast(kind, dtype=dtype, enabled=enabled):
            out = fn(*self.args, **self.kwargs)
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        leaves = tree_flatten((self.args, self.kwargs))[0]
        wrt = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
        wrt += [p for m in leaves if isinstance(m, torch.nn.Module) for p in m.parameters() if p.requires_grad]
        if outs and wrt:
            torch.autograd.grad(outs, wrt, grad_outputs=[torch.ones_like(t) for t in outs], allow_unused=True)
        if device is not None:   # the copies were allocated on the caller's stream: done with them before they go
            device.current_stream().synchronize()


def _copy(value: Any) -> Any:
    if isinstance(value, torch.nn.Module):
        return _twin(value)
    if not isinstance(value, torch.Tensor):
        return value
    out = value.detach().clone()
    if value.requires_grad:
        out.requires_grad_(True)
    # torch._dynamo.mark_dynamic's and mark_static's marks, kept: dynamo guards on whether a tensor carries any
    for name, marks in vars(value).items():
        if name.startswith("_dynamo"):
            setattr(out, name, set(marks) if isinstance(marks, (set, frozenset)) else marks)
    return out


def _twin(module: torch.nn.Module) -> torch.nn.Module:
    """A module of `module`'s class holding copies of its parameters and buffers as they are now (in a
    sharded model's pass: the gathered ones). The side thread builds on it while the live module
    trains, reshards or steps its optimizer; compiled code guards on the class and the tensors'
    properties, not on the object, so what is built for the twin serves the live module."""
    twin = object.__new__(type(module))   # FSDP2's class would build its original class on __new__
    twin.__dict__.update(module.__dict__)
    twin._parameters = {k: None if p is None else torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
                        for k, p in module._parameters.items()}
    twin._buffers = {k: None if b is None else b.detach().clone() for k, b in module._buffers.items()}
    twin._modules = {k: None if m is None else _twin(m) for k, m in module._modules.items()}
    return twin


def _kind(args: tuple, kwargs: dict) -> tuple:
    leaves, spec = tree_flatten((args, kwargs))
    device = next((t.device.type for t in leaves if isinstance(t, torch.Tensor)), "cpu")
    signature = tuple((t.dtype, t.dim(), t.requires_grad) if isinstance(t, torch.Tensor) else type(t).__name__
                      for t in leaves)
    return (str(spec), signature, torch.is_grad_enabled(), torch.is_autocast_enabled(device),
            torch.get_autocast_dtype(device))


class Switchable:
    """A function with an eager and a compiled form; each call runs the one its compiler has in force."""

    def __init__(self, owner: "BesideCompiler", name: str, eager: Callable, compiled: Callable):
        self.owner, self.name, self.eager, self.compiled = owner, name, eager, compiled
        self.kinds: set = set()

    def __call__(self, *args, **kwargs):
        owner = self.owner
        owner._called()
        if owner.compiled:
            return self.compiled(*args, **kwargs)
        if owner.recording and len(self.kinds) < MAX_KINDS:
            kind = _kind(args, kwargs)
            if kind not in self.kinds:
                self.kinds.add(kind)
                owner._submit(self, _Example(args, kwargs))
        return self.eager(*args, **kwargs)


class BesideCompiler:
    """The switch between eager and compiled code for one process, and its side thread.

    `mode`: "background" (eager first, compiled built beside) or "synchronous" (compiled from the
    first call). `clock`: seconds, for the take-over time reported (tests pass their own). `agree`:
    with several ranks, the minimum over the ranks of a state code (1 built, 0 building, -1 failed),
    called at every pass boundary until the switch, so that the ranks switch (or give up) together."""

    def __init__(self, mode: str, clock: Callable[[], float] = time.monotonic,
                 agree: Callable[[int], int] | None = None):
        if mode not in MODES:
            raise ValueError(f"compile mode {mode!r} is not one of {MODES}")
        self.mode = mode
        self.compiled = mode == "synchronous"       # what calls run until the next pass boundary
        self.recording = mode == "background"
        self.failed: BaseException | None = None
        self.takeover_s: float | None = None        # seconds from construction to the switch
        self._clock, self._start = clock, clock()
        self._passes = threading.RLock()
        self._state = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._pending = 0
        self._depth = 0
        self._seen: set[str] = set()
        self._info: PassInfo | None = None
        self._agree = agree
        self._gave_up = False

    def function(self, name: str, eager: Callable, compiled: Callable) -> Switchable:
        """`eager` and `compiled` (torch.compile of the same function) behind one callable."""
        return Switchable(self, name, eager, compiled)

    @property
    def building(self) -> bool:
        """A side thread is compiling or has work queued."""
        return self._thread is not None and self._thread.is_alive()

    @contextlib.contextmanager
    def pass_(self, name: str):
        """One pass (a worker call): the switch to compiled code happens only here, before any call of
        the pass, and never inside another pass. Yields a PassInfo filled in when the pass ends."""
        with self._passes:
            outer = self._depth == 0
            if outer:
                self._begin(name)
                self._info = PassInfo()
                compiling_before = compile_clock.seconds() if compile_clock.install() else None
            info = self._info
            self._depth += 1
            try:
                yield info
            finally:
                self._depth -= 1
                if outer:
                    self._seen.add(name)
                    self._info = None
                    if compiling_before is not None:
                        info.compile_s = compile_clock.seconds() - compiling_before

    def _begin(self, name: str) -> None:
        if self.compiled or self._gave_up:
            return
        if name in self._seen and self.recording:
            self.recording = False     # every pass of a step has run once: no new kind to wait for
            self._start_building()
        with self._state:
            code = -1 if self.failed is not None else int(not self.recording and self._pending == 0)
        if self._agree is not None:
            code = self._agree(code)
        if code < 0:
            self._gave_up, self.recording = True, False
            if self.failed is None:
                logger.warning("building compiled code failed on another rank; every rank stays eager")
            self._queue.put(None)
        elif code == 1:
            self._stop()
            self.compiled = True
            self.takeover_s = self._clock() - self._start
            logger.warning("compiled code takes over after %.1f s (pass %s; the passes before it ran eagerly while "
                           "it was built)", self.takeover_s, name)

    def _called(self) -> None:
        info = self._info
        if info is not None:
            info.compiled = self.compiled if info.compiled is None else info.compiled and self.compiled

    def _submit(self, fn: Switchable, example: _Example) -> None:
        with self._state:
            if self.failed is not None:
                return
            self._pending += 1
        self._queue.put((fn, example))

    def _start_building(self) -> None:
        """Start the side thread on the queued calls (once)."""
        with self._state:
            if self._thread is not None or self._pending == 0 or self.failed is not None:
                return
            _own_compile_flag()
            _builder_started()
            self._thread = threading.Thread(target=self._build, name="verl-compile-beside", daemon=True)
            self._thread.start()

    def _build(self) -> None:
        """The side thread: each recorded call run through the compiled function, in order."""
        _builders.add(threading.get_ident())
        try:
            while (item := self._queue.get()) is not None:
                fn, example = item
                try:
                    example.run(fn.compiled)
                except Exception as err:   # noqa: BLE001 - any failure means: stay eager
                    with self._state:
                        self.failed, self.recording = err, False
                    logger.warning("building compiled code beside the eager steps failed in %s (%s: %s); the run "
                                   "stays eager", fn.name, type(err).__name__, err)
                    return
                finally:
                    del item, example
                    with self._state:
                        self._pending -= 1
        finally:
            _builders.discard(threading.get_ident())
            _builder_ended()

    def _stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()

    def wait_built(self, timeout: float | None = None) -> bool:
        """Build the queued calls now if the side thread has not started, and block until they are built or
        the build failed; False on failure or timeout (tests)."""
        self._start_building()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._state:
                if self._pending == 0 or self.failed is not None:
                    return self.failed is None
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
