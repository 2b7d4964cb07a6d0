"""The beside-compiler (verl/utils/compile_beside.py): eager calls until the compiled code, built in a side
thread on copies of the eager calls' inputs, takes over at a pass boundary; results equal eager before and
after; no switch inside a pass; a failed build leaves the run eager with one warning.

CPU, float32, torch.compile's `aot_eager` backend (dynamo's graph and AOTAutograd's forward/backward
split, run by torch's kernels), wrapped to count what the side thread built and what ran compiled.
"""
import logging
import threading

import pytest
import torch
from torch._dynamo.utils import counters

from verl.utils.compile_beside import BesideCompiler, building_beside


class Counting:
    """aot_eager, counting compiles (and the threads they ran on) and this thread's calls into compiled code
    (the side thread's warm-up calls are not counted)."""

    def __init__(self, fail: bool = False):
        self.compiles, self.calls, self.threads, self.fail = 0, 0, set(), fail
        self.here = threading.get_ident()

    def __call__(self, gm, example_inputs):
        if self.fail:
            raise RuntimeError("no code generator here")
        self.compiles += 1
        self.threads.add(threading.get_ident())
        compiled = torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

        def run(*args):
            self.calls += threading.get_ident() == self.here
            return compiled(*args)

        return run


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.norm = torch.nn.LayerNorm(16)
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x):
        return x + self.down(torch.nn.functional.silu(self.up(self.norm(x))))


def _run(block, x):
    return block(x)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _passes(compiler, fn, block, twin, steps, wait=True):
    """Steps of a scoring pass (no grad) and an update pass (forward and backward) through `fn`, against
    eager on `twin` (an equal block): outputs and gradients compared; (pass name, ran compiled) per pass."""
    ran = []
    for step in range(steps):
        x = torch.randn(3 + step, 5, 16, generator=torch.Generator().manual_seed(step))
        with compiler.pass_("score") as info, torch.no_grad():
            torch.testing.assert_close(fn(block, x), twin(x), rtol=1e-6, atol=1e-6)
        ran.append(("score", info.compiled))
        with compiler.pass_("update") as info:
            for b, f in ((block, fn), (twin, _run)):
                b.zero_grad()
                f(b, x.requires_grad_()).pow(2).mean().backward()
        for p, q in zip(block.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
        ran.append(("update", info.compiled))
        if wait:
            assert compiler.wait_built(60)
    return ran


def test_eager_first_then_compiled_from_a_pass_boundary_with_equal_results():
    backend = Counting()
    compiler = BesideCompiler("background")
    fn = compiler.function("block", _run, torch.compile(_run, backend=backend, dynamic=True))
    block, twin = Block(), Block()
    ran = _passes(compiler, fn, block, twin, steps=3)
    # step 1 records both kinds (grad off, grad on) and runs eager; the side thread builds both; the first
    # pass of step 2 starts a new round (a pass name seen before) and the compiled code takes over there
    assert ran == [("score", False), ("update", False), ("score", True), ("update", True),
                   ("score", True), ("update", True)]
    # every graph (grad off, grad on) was built beside, none here; the compiled steps ran them
    assert backend.compiles >= 2 and threading.get_ident() not in backend.threads
    assert backend.calls >= 2 * 2   # two steps of the score and update forwards
    calls, compiles = backend.calls, backend.compiles
    _passes(compiler, fn, block, twin, steps=1)
    assert backend.calls > calls and backend.compiles == compiles
    assert compiler.takeover_s is not None and compiler.failed is None
    assert not building_beside()   # the side thread ended with the switch: CUDA graphs may be recorded again


def test_no_switch_inside_a_pass_and_no_new_kind_wait():
    """A pass that begins before the build is done stays eager to its end, however long it runs; the
    switch waits for the next pass boundary."""
    backend = Counting()
    compiler = BesideCompiler("background")
    fn = compiler.function("block", _run, torch.compile(_run, backend=backend, dynamic=True))
    block = Block()
    x = torch.randn(2, 4, 16)
    with compiler.pass_("score") as first, torch.no_grad():
        fn(block, x)
    with compiler.pass_("score") as second, torch.no_grad():   # begins while the side thread may still build
        assert compiler.wait_built(60)
        with compiler.pass_("nested") as inner:   # a pass within a pass is part of it: no switch here
            fn(block, x)
        fn(block, x)
    assert inner is second
    assert first.compiled is False and second.compiled is False and backend.calls == 0
    with compiler.pass_("score") as third, torch.no_grad():
        fn(block, x)
    assert third.compiled is True and backend.calls == 1


def test_twins_let_the_build_read_weights_the_live_module_is_changing():
    """The side thread builds on copies of the module and inputs taken at the eager call: the live block's
    weights changing afterwards (an optimizer step) changes nothing the build sees, and the compiled code
    then runs on the live block's current weights."""
    backend = Counting()
    compiler = BesideCompiler("background")
    fn = compiler.function("block", _run, torch.compile(_run, backend=backend, dynamic=True))
    block, twin = Block(), Block()
    x = torch.randn(2, 4, 16)
    with compiler.pass_("score"), torch.no_grad():
        fn(block, x)
        for b in (block, twin):
            b.up.weight.mul_(-1.0)
    assert compiler.wait_built(60)
    with compiler.pass_("score") as info, torch.no_grad():
        torch.testing.assert_close(fn(block, x), twin(x), rtol=1e-6, atol=1e-6)
    assert info.compiled is True and backend.calls == 1 and threading.get_ident() not in backend.threads


def test_a_failed_build_stays_eager_for_good_with_one_warning(caplog):
    compiler = BesideCompiler("background")
    fn = compiler.function("block", _run, torch.compile(_run, backend=Counting(fail=True), dynamic=True))
    block, twin = Block(), Block()
    with caplog.at_level(logging.WARNING, logger="verl.utils.compile_beside"):
        ran = _passes(compiler, fn, block, twin, steps=3, wait=False)
        assert not compiler.wait_built(60)
        ran += _passes(compiler, fn, block, twin, steps=2, wait=False)
    assert {compiled for _, compiled in ran} == {False}
    assert compiler.failed is not None and not compiler.compiled
    warnings = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(warnings) == 1 and "stays eager" in warnings[0].getMessage()


def test_ranks_switch_together():
    """With several ranks the switch needs every rank built (the minimum of their codes): a rank still
    building holds the others eager; a rank that failed keeps every rank eager."""
    others = {"code": 0}
    compiler = BesideCompiler("background", agree=lambda code: min(code, others["code"]))
    fn = compiler.function("block", _run, torch.compile(_run, backend=Counting(), dynamic=True))
    block, x = Block(), torch.randn(2, 4, 16)
    for expected, other in ((False, None), (False, 0), (True, 1)):
        if other is not None:
            others["code"] = other
        with compiler.pass_("score") as info, torch.no_grad():
            fn(block, x)
        assert info.compiled is expected
        assert compiler.wait_built(60)
    failing = BesideCompiler("background", agree=lambda code: min(code, -1))
    fn = failing.function("block", _run, torch.compile(_run, backend=Counting(), dynamic=True))
    for _ in range(3):
        with failing.pass_("score") as info, torch.no_grad():
            fn(block, x)
        assert info.compiled is False
        failing.wait_built(60)


def test_synchronous_runs_compiled_from_the_first_call():
    backend = Counting()
    compiler = BesideCompiler("synchronous")
    fn = compiler.function("block", _run, torch.compile(_run, backend=backend, dynamic=True))
    with compiler.pass_("score") as info, torch.no_grad():
        fn(Block(), torch.randn(2, 4, 16))
    assert info.compiled is True and backend.threads == {threading.get_ident()} and not compiler.building


def test_a_pass_counts_the_seconds_torch_compile_ran_in_it():
    """perf/compile_s/<pass> (verl/utils/compile_clock.py): the pass that compiles reports its compile's wall
    time, a later pass running the same compiled code reports none; synchronous mode, as a run's default."""
    compiler = BesideCompiler("synchronous")
    fn = compiler.function("block", _run, torch.compile(_run, backend=Counting(), dynamic=True))
    block, x = Block(), torch.randn(3, 5, 16)
    seconds = []
    for _ in range(2):
        with compiler.pass_("score") as info, torch.no_grad():
            fn(block, x)
        seconds.append(info.compile_s)
    assert seconds[0] > 0.01 and seconds[1] == 0.0


def test_the_first_step_runs_alone_and_the_build_starts_with_the_second():
    """Nothing compiles while the first step's passes run (a one-step run compiles nothing); the side thread
    starts where the first pass of a name already seen begins, with every kind of call recorded."""
    backend = Counting()
    compiler = BesideCompiler("background")
    fn = compiler.function("block", _run, torch.compile(_run, backend=backend, dynamic=True))
    block, twin = Block(), Block()
    ran = _passes(compiler, fn, block, twin, steps=1, wait=False)
    assert ran == [("score", False), ("update", False)]
    assert backend.compiles == 0 and not compiler.building and not building_beside()
    with compiler.pass_("score") as second, torch.no_grad():
        assert compiler.building and building_beside()
        fn(block, torch.randn(2, 4, 16))
    assert second.compiled is False
    assert compiler.wait_built(60) and backend.compiles >= 2   # both kinds: grad off and on
    ran = _passes(compiler, fn, block, twin, steps=1, wait=False)
    assert ran == [("score", True), ("update", True)] and not building_beside()


def test_the_training_thread_gets_the_interpreter_back_quickly_while_a_side_thread_builds():
    """torch drops the GIL around each operator and the side thread's compile takes it; the switch interval
    bounds how long the training thread then waits for it, after every operator. It is short while a side
    thread builds and the interpreter's own again once the compiled code took over."""
    import sys

    from verl.utils import compile_beside

    before, short = sys.getswitchinterval(), compile_beside.BUILDING_SWITCH_INTERVAL
    assert before > short
    seen = []

    def observing(gm, example_inputs):   # the build's compile, noting the interval it runs under
        seen.append(sys.getswitchinterval())
        return gm.forward

    compiler = BesideCompiler("background")
    fn = compiler.function("block", _run, torch.compile(_run, backend=observing, dynamic=True))
    block = Block()
    x = torch.randn(2, 4, 16)
    for _ in range(2):   # the first pass records the call; the second (a name seen) starts the build
        with compiler.pass_("score"), torch.no_grad():
            fn(block, x)
    assert compiler.wait_built(60) and seen == [pytest.approx(short)]
    with compiler.pass_("score") as third, torch.no_grad():
        fn(block, x)
    assert third.compiled is True
    assert sys.getswitchinterval() == before and not building_beside()
