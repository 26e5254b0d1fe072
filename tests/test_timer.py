"""The timer and the step statistics: collections kept out of measured steps, outliers listed
with their cause, the overhead measured like with like, first steps and losses at equal
step counts."""

from __future__ import annotations

import gc
import time
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import FakeClock

from harness import backends
from harness.common.stats import cell, outliers, summarize
from harness.reports import run as run_render
from harness.timing import runner
from harness.timing.events import EventLog
from harness.timing.timer import Timer, overhead_flag


class Cycle:
    def __init__(self):
        self.me = self


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    from harness.timing import events as events_module
    from harness.timing import timer as timer_module

    fake = FakeClock()
    monkeypatch.setattr(timer_module, "time", fake)
    monkeypatch.setattr(events_module, "time", fake)
    return fake


class FakeSession:
    """Phases that make cyclic garbage (which triggers collections) and can be slowed. On a
    FakeClock (`clock`) every phase call takes `work_ms`; else they take what they take."""

    def __init__(self, garbage: int = 3000, slow_call: int | None = None, sync_ms: float = 0.0,
                 plain_ms: float = 0.0, clock=time, work_ms: float = 0.0):
        self.garbage, self.slow_call, self.sync_ms, self.plain_ms = garbage, slow_call, sync_ms, plain_ms
        self.clock, self.work_ms = clock, work_ms
        self.calls = 0

    def _work(self):
        self.calls += 1
        junk = [Cycle() for _ in range(self.garbage)]
        self.clock.sleep(self.work_ms / 1e3)
        if self.calls == self.slow_call:
            self.clock.sleep(0.05)
        return len(junk)

    forward = lambda self, grad=True: self._work()  # noqa: E731
    backward = optimizer_step = fused_step = _work

    def plain_step(self):
        self.clock.sleep(self.plain_ms / 1e3)
        return self._work()

    def sync(self, value=None):
        self.clock.sleep(self.sync_ms / 1e3)

    def reset_peak_memory(self):
        pass

    def peak_memory(self):
        return None

    def zero_grad(self):
        pass


def _timer(session, warmup=3, steps=8):
    opts = SimpleNamespace(mode="train", warmup=warmup, steps=steps)
    events = EventLog(backends.get("torch").compile_events).__enter__()
    return Timer(session, opts, lambda m: None, events), events


def test_no_collection_inside_measured_steps() -> None:
    """Phases that make cyclic garbage trigger collections in warm-up; none may land in a
    measured phase (they did before the collector was paused: one 200 ms collection made a
    JAX backward step 10x its median)."""
    timer, events = _timer(FakeSession())
    try:
        timer.loop("split step", ("forward", "backward", "optimizer"))
    finally:
        events.__exit__(None, None, None)
    collections = [e for e in events.events if e.kind == "gc"]
    assert collections, "the fake phases should trigger collections (warm-up is not paused)"
    measured = [iv for name in ("forward", "backward", "optimizer") for iv in timer.intervals[name]]
    inside = [e for e in collections for t0, t1 in measured if e.end >= t0 and e.start <= t1]
    assert not inside
    assert gc.isenabled()


def test_outlier_listed_with_cause(clock) -> None:
    """A measured step slowed by a collection is listed as an outlier with the collection as
    its cause; one slowed by something unseen says that nothing was recorded. (Phases of
    1 ms on the fake clock, the slow call 50 ms more, the collection 200 ms: no other step
    can stand out.)"""
    session = FakeSession(garbage=10, slow_call=3 * 3 + 2 * 3 + 2, clock=clock, work_ms=1.0)  # 3rd measured backward
    timer, events = _timer(session)
    original = session.forward

    def slow_collection(phase, info):  # after the event log's own callback: inside the recorded collection
        if phase == "start":
            clock.sleep(0.2)  # what a full collection of the models' host objects took on an H100 host

    def forward_with_collection(grad=True):
        if session.calls == 3 * 3 + 3 * 4:  # the 5th measured step's forward
            session.alive = [Cycle() for _ in range(200_000)]  # young objects a full collection must visit
            gc.callbacks.append(slow_collection)
            try:
                gc.collect()
            finally:
                gc.callbacks.remove(slow_collection)
        return original(grad)

    session.forward = forward_with_collection
    try:
        timer.loop("split step", ("forward", "backward", "optimizer"))
    finally:
        events.__exit__(None, None, None)
    slow_bwd = outliers(timer.times["backward"])
    assert [o["index"] for o in slow_bwd] == [2]
    assert timer.causes("backward", 2) == []
    slow_fwd = outliers(timer.times["forward"])
    assert [o["index"] for o in slow_fwd] == [4]
    assert any(c.startswith("gc gen2") for c in timer.causes("forward", 4))


def test_overhead_like_with_like(clock) -> None:
    """Per-phase syncs cost time the plain steps do not pay: ratio > 1 in every round; a plain
    loop slowed by something else comes out below 1 and is flagged, not printed as overhead.
    (On the fake clock: 1 ms a phase call, 2 ms a sync.)"""
    timer, events = _timer(FakeSession(garbage=10, sync_ms=2.0, clock=clock, work_ms=1.0), steps=3)
    with events:
        rec = timer.overhead(("forward", "backward", "optimizer"), "step")
    assert rec["instrumented_step_ms"] == pytest.approx(3 * (1 + 2))  # a sync after each phase
    assert rec["plain_step_ms"] == pytest.approx((3 * 1 + 2) / 3)  # one sync per round of 3 steps
    assert rec["round_ratios"] == pytest.approx([9 / (5 / 3)] * 4) and "flag" not in rec
    assert len(rec["round_ratios"]) == rec["rounds"] and rec["steps_per_round"] == 3
    timer, events = _timer(FakeSession(garbage=10, plain_ms=20.0, clock=clock, work_ms=1.0), steps=3)
    with events:
        rec = timer.overhead(("fused_step",), None)
    assert rec["ratio"] == pytest.approx(1 / 21) and "faster than plain ones in every round" in rec["flag"]


def test_each_timed_round_starts_aligned(clock) -> None:
    """The rounds call the session's `align` before each timed loop, outside the time
    (here it takes 50 ms of the fake clock, a rank waiting for a late one); a session
    without it (the other tests' FakeSession) gets its `sync`."""
    class Aligned(FakeSession):
        aligned = 0

        def align(self):
            self.aligned += 1
            self.clock.sleep(0.05)

    session = Aligned(garbage=10, clock=clock, work_ms=1.0)
    timer, events = _timer(session, steps=3)
    with events:
        rec = timer.overhead(("fused_step",), None)
    assert session.aligned == 2 * rec["rounds"]  # one per loop per round
    assert rec["plain_step_ms"] == pytest.approx(1.0)  # the steps' 1 ms, none of the 50 ms wait


def test_measured_steps_start_aligned(clock) -> None:
    """The loop calls `align` once, after the collection that opens the measured steps and
    before the first of them, outside every timed step: in a data-parallel run the ranks
    leave that collection at different times, and an early rank's first step would count
    its wait (here align's 50 ms of the fake clock)."""
    class Aligned(FakeSession):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.seen = []

        def align(self):
            self.seen.append((self.calls, gc.isenabled()))
            self.clock.sleep(0.05)

    session = Aligned(garbage=10, clock=clock, work_ms=1.0)
    timer, events = _timer(session, steps=4, warmup=2)
    with events:
        timer.loop("split step", ("forward", "backward", "optimizer"))
    assert session.seen == [(2 * 3, False)]  # after the 2 warm-up steps' 3 phases, collector off
    assert timer.times["step"] == pytest.approx([3.0] * 4)  # each step its phases' 1 ms, no wait


def test_overhead_flag_reads_a_ratio_below_one() -> None:
    """Below 1 in every round: something slows the baseline; below 1 only in the median:
    inside the spread; 1 or more: an overhead, no flag."""
    every = overhead_flag(0.9, [0.88, 0.93], "steps with layer ranges", "steps without")
    assert every.startswith("steps with layer ranges ran faster than steps without in every round (0.880-0.930x)")
    assert overhead_flag(0.99, [0.95, 1.04], "a", "b") == \
        "ratio below 1 within the rounds' spread (0.950-1.040x): no measurable overhead"
    assert overhead_flag(1.0, [0.9, 1.1], "a", "b") is None and overhead_flag(1.2, [1.1, 1.3], "a", "b") is None


def test_summary_is_robust() -> None:
    times = [22.3, 22.5, 22.3, 21.9, 22.0, 22.1, 21.8, 21.9, 21.8, 216.3]  # an H200 run's JAX backward
    rec = summarize(times)
    assert rec["median_ms"] == pytest.approx(np.median(times))
    assert rec["p10_ms"] == pytest.approx(np.percentile(times, 10))
    assert rec["p90_ms"] == pytest.approx(np.percentile(times, 90))
    assert rec["std_ms"] > rec["median_ms"]  # what the old "median ± std" printed: 22.1 ± 61.4
    assert [(o["index"], round(o["x_median"], 1)) for o in rec["outliers"]] == [(9, 9.8)]
    assert summarize([10.0, 10.1, 10.2, 9.9, 10.05, 10.3])["outliers"] == []  # jitter is not an outlier
    assert cell(rec, 1) == "22.1 (21.8-41.9)"
    assert cell({"median_ms": 1.0, "std_ms": 0.5}, 1) == "1.0 ± 0.5"  # records written before p10/p90


@pytest.fixture(scope="module")
def torch_run() -> dict:
    """One torch run on the CPU, shared: no warm-up, 2 steps, with layer ranges."""
    opts = runner.RunSpec(backend="torch", model="tiny", ctx=16, batch=1, warmup=0, steps=2, device="cpu",
                          layer_ranges=True)
    return runner.run(opts)


def test_run_reports_first_step_warmup_zero_and_losses_at_equal_steps(torch_run: dict) -> None:
    doc = torch_run
    assert doc["status"] == "ok", doc["error"]
    assert any(w.startswith("--warmup 0") for w in doc["warnings"])
    first = doc["first_step"]
    assert first["split_step_ms"] == pytest.approx(doc["phases"]["step"]["times_ms"][0])
    assert first["time_to_first_step_ms"] == pytest.approx(first["setup_ms"] + first["split_step_ms"])
    assert (doc["loss"]["first_after_steps"], doc["loss"]["last_after_steps"]) == (0, 1)
    text = run_render.format_result(doc)
    assert "time to first step" in text and "warning: --warmup 0" in text


def test_cyclic_garbage_is_freed_between_measured_steps() -> None:
    """With the automatic collector off, objects held only by reference cycles (as JAX's vjp
    residuals are) must still be freed every step: device buffers would pile up until the
    step runs out of memory."""
    import weakref

    class Residuals:
        pass

    alive = []

    class CyclicSession(FakeSession):
        def _work(self):
            r = Residuals()
            r.me = r  # a cycle: refcounting alone never frees it
            alive.append(weakref.ref(r))
            return super()._work()

    timer, events = _timer(CyclicSession(garbage=10), warmup=2, steps=6)
    with events:
        timer.loop("split step", ("forward", "backward", "optimizer"))
    gc.disable()
    try:
        # Collected after each step: at most the last step's three are still alive here.
        assert sum(r() is not None for r in alive) <= 3
    finally:
        gc.enable()


def test_drop_forgets_the_failed_loop_only() -> None:
    """`drop` removes a loop's phases, its step, first step and losses, and keeps another loop's."""
    timer, events = _timer(FakeSession(garbage=10), warmup=1, steps=2)
    with events:
        timer.loop("fused step", ("fused_step",), outer=None)
        timer.loop("split step", ("forward", "backward", "optimizer"))
        timer.drop("split step", ("forward", "backward", "optimizer"))
    assert list(timer.times) == ["fused_step"] and list(timer.intervals) == ["fused_step"]
    assert list(timer.first_step_ms) == ["fused step"]
    assert [x["loop"] for x in timer.losses] == ["fused step", "fused step"]


def test_rounds_alternate_and_run_before_untimed(clock) -> None:
    """Each round runs every loop once for steps_per_round steps; `alternate` reverses the
    order every other round and `before` runs ahead of each loop, outside its time (20 ms
    of the fake clock; the loops themselves take none)."""
    timer, events = _timer(FakeSession(garbage=10, clock=clock), steps=2)
    order: list[str] = []
    loops = {"a": lambda n: order.append(f"a{n}"), "b": lambda n: order.append(f"b{n}")}
    with events:
        means = timer.rounds(loops, "test", alternate=True, before=lambda key: clock.sleep(0.02))
    assert order == ["a2", "b2", "b2", "a2"] * (len(means["a"]) // 2)
    assert means == {"a": [0.0] * 4, "b": [0.0] * 4}  # ms per step


def test_layer_ranges_overhead_runs_in_the_timer_s_rounds(torch_run: dict) -> None:
    """A torch run with --layer-ranges measures their cost in Timer.rounds: 4 rounds of
    min(steps, 5) steps with them and without."""
    doc = torch_run
    assert doc["status"] == "ok", doc["error"]
    layers = doc["layer_ranges"]
    assert layers["rounds"] == 4 and layers["steps_per_round"] == 2 and len(layers["round_ratios"]) == 4
    assert layers["with_ms"] > 0 and layers["without_ms"] > 0
    assert layers["overhead_ratio"] == pytest.approx(layers["with_ms"] / layers["without_ms"])


@pytest.mark.parametrize("warmup, first", [(2, "warm-up 1/2"), (0, "step 1/3")])
def test_a_compiling_backend_says_its_first_step_compiles(warmup: int, first: str) -> None:
    """torch.compile's first compile sat for minutes behind a bare "warm-up 1/5": the first
    step of each loop of a compiling backend says it compiles; later steps, and a backend
    that does not compile, do not."""
    assert [b.name for b in backends.all_backends() if b.compiles] == ["torch-compile", "torch-compile-cg", "jax"]
    said: list[str] = []
    opts = SimpleNamespace(mode="train", warmup=warmup, steps=3)
    with EventLog(None) as events:
        timer = Timer(FakeSession(garbage=1), opts, said.append, events, compiles=True)
        timer.loop("split step", ("forward",))
        timer.loop("fused step", ("fused_step",), outer=None)
    compiling = [m for m in said if m.endswith(" (compiling, this can take minutes)")]
    assert compiling == [f"split step: {first} (compiling, this can take minutes)",
                         f"fused step: {first} (compiling, this can take minutes)"]
    assert len(said) == 2 * (warmup + 3)
    said.clear()
    with EventLog(None) as events:
        Timer(FakeSession(garbage=1), opts, said.append, events).loop("split step", ("forward",))
    assert said and not any("compiling" in m for m in said)


def test_jax_compile_events_are_time_spent_not_time_saved(tmp_path) -> None:
    """A persistent-cache hit reports the compile time it saved; that time was never spent in
    this process, so it must not become an interval that overlaps (and "explains") the steps
    before it. The lookup itself and a real compilation are recorded."""
    pytest.importorskip("jax")
    import jax
    import jax.monitoring
    import jax.numpy as jnp

    with EventLog("jax.monitoring") as log:
        jax.monitoring.record_event_duration_secs("/jax/compilation_cache/compile_time_saved_sec", 15.0)
        jax.monitoring.record_event_duration_secs("/jax/core/compile/backend_compile_duration", 0.002)
    assert [(e.kind, e.detail, round(1e3 * (e.end - e.start), 6)) for e in log.events] == \
        [("compile", "backend_compile_duration", 2.0)]

    names = {"jax_compilation_cache_dir": str(tmp_path), "jax_persistent_cache_min_compile_time_secs": 0,
             "jax_persistent_cache_min_entry_size_bytes": -1}
    before = {k: getattr(jax.config, k) for k in names}
    try:
        for k, v in names.items():
            jax.config.update(k, v)
        f = jax.jit(lambda x: jnp.tanh(x) * 3.0 + x.sum())
        f(jnp.ones(7)).block_until_ready()  # compiles and writes the cache entry
        jax.clear_caches()
        t0 = time.perf_counter()
        with EventLog("jax.monitoring") as log:
            f(jnp.ones(7)).block_until_ready()  # a persistent-cache hit
        elapsed = time.perf_counter() - t0
    finally:
        for k, v in before.items():
            jax.config.update(k, v)
    details = {e.detail for e in log.events}
    assert "cache_retrieval_time_sec" in details  # the hit happened, and its lookup is recorded
    assert "compile_time_saved_sec" not in details
    assert all(e.end - e.start <= elapsed for e in log.events)
