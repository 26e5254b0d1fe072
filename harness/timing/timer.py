"""The timer: phases inside NVTX ranges, each ended by a device synchronization.

What it guards against, and how:
- Python's cyclic garbage collector. With the models' host objects alive, a full
  (generation 2) collection takes ~200 ms and lands inside whichever phase allocates
  the object that triggers it (it made one JAX backward step 10x its median on an H100).
  Measured steps therefore run with the automatic collector off, after a collection and
  `gc.freeze()` at the end of warm-up, and the timer collects between steps, untimed:
  device buffers held by reference cycles (JAX's vjp residuals are) must still be freed
  every step, or a large step runs out of memory within a few steps.
- Steps that stand out anyway: each phase call's interval is kept with the host events
  (collections, compilations) recorded during it (`EventLog`), so an outlier step is
  listed with its cause rather than folded into the figures.
- Compilation in the measured steps: the first step of each loop (compilation,
  autotuning, allocation) is timed on its own, and `--warmup 0` is flagged.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Iterator

from harness.backends.ranges import phase_range
from harness.timing.events import EventLog

OVERHEAD_ROUNDS = 4
OVERHEAD_STEPS = 5


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Collect once, freeze what survives and keep the cyclic collector off inside."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


class Timer:
    """Runs phases inside NVTX ranges, synchronizing at each end, and records times and peaks."""

    def __init__(self, session, opts, progress: Callable[[str], None], events: EventLog,
                 fault: Callable[[str], BaseException | None] = lambda name: None, compiles: bool = False):
        """`compiles`: the backend compiles on a loop's first step, which the progress line
        then says (minutes of silence behind "warm-up 1/5" read as a hang)."""
        self.session, self.opts, self.progress, self.events, self.fault = session, opts, progress, events, fault
        self.compiles = compiles
        self.times: dict[str, list[float]] = {}
        self.intervals: dict[str, list[tuple[float, float]]] = {}
        self.peaks: dict[str, int] = {}
        self.first_step_ms: dict[str, float] = {}  # loop label -> its first step, warm-up or not
        self.losses: list[dict] = []  # {"loop", "step": optimizer steps taken before it, "loss"}
        self.optimizer_steps = 0
        self.last_loss = None  # the loss of the latest forward or fused step

    def phase(self, name: str, record: bool) -> None:
        s, opts = self.session, self.opts
        s.reset_peak_memory()
        with phase_range(name):
            t0 = time.perf_counter()
            try:
                planted = self.fault(name)
                if planted is not None:
                    raise planted
                if name == "forward":
                    out = s.forward(grad=opts.mode != "forward")
                elif name == "backward":
                    out = s.backward()
                elif name == "optimizer":
                    out = s.optimizer_step()
                else:
                    out = s.fused_step()
                s.sync(out)
            except Exception as exc:
                raise PhaseFailure(name, exc) from exc
            t1 = time.perf_counter()
        if name in ("forward", "fused_step") and out is not None:
            self.last_loss = out
        if name in ("optimizer", "fused_step"):
            self.optimizer_steps += 1
        if record:
            self.times.setdefault(name, []).append((t1 - t0) * 1e3)
            self.intervals.setdefault(name, []).append((t0, t1))
            peak = s.peak_memory()
            if peak is not None:
                self.peaks[name] = max(self.peaks.get(name, 0), peak)

    def step(self, phases: tuple[str, ...], record: bool, outer: str | None) -> tuple[float, float]:
        t0 = time.perf_counter()
        with phase_range(outer if record else "warmup") if outer or not record else contextlib.nullcontext():
            for name in phases:
                self.phase(name, record)
        if self.opts.mode == "forward-backward":
            self.session.zero_grad()
        return t0, time.perf_counter()

    def loop(self, label: str, phases: tuple[str, ...], outer: str | None = "step") -> None:
        """Warm-up steps, then measured ones with the collector paused, started aligned (the
        session's `align`, else its `sync`); `outer` names the range around each measured step."""
        o = self.opts
        compiling = " (compiling, this can take minutes)" if self.compiles else ""
        for i in range(o.warmup):
            self.progress(f"{label}: warm-up {i + 1}/{o.warmup}" + (compiling if i == 0 else ""))
            t0, t1 = self.step(phases, False, outer)
            self.first_step_ms.setdefault(label, (t1 - t0) * 1e3)
        with collector_paused():
            # The ranks of a data-parallel run leave the collection above at different times;
            # unaligned, an early rank's first measured step would count its wait for the late one.
            getattr(self.session, "align", self.session.sync)()
            for i in range(o.steps):
                self.progress(f"{label}: step {i + 1}/{o.steps}" + (compiling if i == 0 and not o.warmup else ""))
                steps_before = self.optimizer_steps
                t0, t1 = self.step(phases, True, outer)
                self.first_step_ms.setdefault(label, (t1 - t0) * 1e3)
                if outer:
                    self.times.setdefault(outer, []).append((t1 - t0) * 1e3)
                    self.intervals.setdefault(outer, []).append((t0, t1))
                self.losses.append({"loop": label, "step": steps_before, "loss": float(self.last_loss)})
                gc.collect()  # between steps, untimed; cheap once warm-up's objects are frozen

    def causes(self, name: str, index: int) -> list[str]:
        """The host events recorded during measured call `index` of `name`."""
        t0, t1 = self.intervals[name][index]
        return [e.describe() for e in self.events.between(t0, t1)]

    @property
    def steps_per_round(self) -> int:
        """Steps per loop in each round of an overhead measurement."""
        return max(1, min(self.opts.steps, OVERHEAD_STEPS))

    def rounds(self, loops: dict[str, Callable[[int], None]], what: str, alternate: bool = False,
               before: Callable[[str], None] = lambda key: None) -> dict[str, list[float]]:
        """Per loop, its mean ms per step in each of OVERHEAD_ROUNDS rounds. A round runs every
        loop (`loops[key](n)` runs n steps) for `steps_per_round` steps, in the given order or,
        with `alternate`, reversed every other round. Ahead of each loop, untimed, run
        `before(key)` and the session's `align` (its `sync` where it has none): the ranks of a
        data-parallel run start each loop together, so none counts the time it waits for a
        later one. After each loop, a sync and a collection. The collector is paused
        throughout, so drift and collections fall on every loop alike."""
        n, means = self.steps_per_round, {key: [] for key in loops}
        with collector_paused():
            for r in range(OVERHEAD_ROUNDS):
                self.progress(f"{what} round {r + 1}/{OVERHEAD_ROUNDS}: {n} steps each of {', '.join(loops)}")
                order = list(loops) if not alternate or r % 2 == 0 else list(reversed(loops))
                for key in order:
                    before(key)
                    getattr(self.session, "align", self.session.sync)()
                    t0 = time.perf_counter()
                    loops[key](n)
                    means[key].append((time.perf_counter() - t0) * 1e3 / n)
                    self.session.sync()
                    gc.collect()
        return means

    def overhead(self, phases: tuple[str, ...], outer: str | None) -> dict:
        """Instrumented steps (ranges, a sync after each phase) against plain ones (no ranges,
        one sync per round), in interleaved rounds of the same number of steps (`rounds`)."""
        s, n = self.session, self.steps_per_round

        def instrumented(steps: int) -> None:
            for _ in range(steps):
                self.step(phases, False, outer)

        def plain(steps: int) -> None:
            out = None
            for _ in range(steps):
                out = s.plain_step()
            s.sync(out)

        means = self.rounds({"instrumented": instrumented, "plain": plain}, "overhead")
        ratios = [i / p for i, p in zip(means["instrumented"], means["plain"])]
        rec = {"instrumented_step_ms": statistics.median(means["instrumented"]),
               "plain_step_ms": statistics.median(means["plain"]),
               "round_ratios": ratios, "rounds": OVERHEAD_ROUNDS, "steps_per_round": n,
               "compared": (f"{n} steps with ranges and a sync after each phase vs {n} plain steps (no ranges, "
                            f"one sync), in {OVERHEAD_ROUNDS} interleaved rounds; medians of the round means")}
        rec["ratio"] = rec["instrumented_step_ms"] / rec["plain_step_ms"]
        if flag := overhead_flag(rec["ratio"], ratios, "instrumented steps", "plain ones"):
            rec["flag"] = flag
        return rec

    def drop(self, label: str, phases: tuple[str, ...]) -> None:
        """Forget loop `label`'s figures of `phases` and its `step` (a loop that failed part
        way), its losses and the gradients it left."""
        for name in (*phases, "step"):
            self.times.pop(name, None)
            self.intervals.pop(name, None)
            self.peaks.pop(name, None)
        self.first_step_ms.pop(label, None)
        self.losses = [x for x in self.losses if x["loop"] != label]
        self.session.zero_grad()


def overhead_flag(ratio: float, ratios: list[float], measured: str, baseline: str) -> str | None:
    """What an overhead ratio below 1 means, None for one of 1 or more: below 1 in every
    round, the baseline loop is being slowed by something the timer does not see; below 1
    only in the median, the overhead is inside the rounds' spread."""
    spread = f"{min(ratios):.3f}-{max(ratios):.3f}x"
    if max(ratios) < 1:
        return (f"{measured} ran faster than {baseline} in every round ({spread}): not an overhead; the "
                f"baseline loop is being slowed by something the timer does not see")
    if ratio < 1:
        return f"ratio below 1 within the rounds' spread ({spread}): no measurable overhead"
    return None


class PhaseFailure(Exception):
    def __init__(self, phase: str, cause: BaseException):
        super().__init__(phase)
        self.phase, self.cause = phase, cause
