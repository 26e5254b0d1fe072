"""harness.bench_attention's timing core on fake thunks: calls per repeat,
rotating rounds, and failures kept per entry.

The thunks take their time on a fake clock that the timing core reads in place of
time.perf_counter: every figure below is exact, whatever else the machine is doing."""

from __future__ import annotations

import itertools

import pytest
from conftest import FakeClock

from harness import bench_attention
from harness.attention import interleaved as bench
from harness.attention.catalog import LEAD_IN_MS

CLOCK = FakeClock()


@pytest.fixture(autouse=True)
def fake_clock(monkeypatch):
    monkeypatch.setattr(bench, "time", CLOCK)


class Clocked:
    """A thunk that takes `ms` per call, plus `first_ms` on the first call of
    each repeat (a repeat starts after a sync); `log` records call order."""

    def __init__(self, name: str, ms: float, log: list, first_ms: float = 0.0, fail_after: int | None = None):
        self.name, self.ms, self.first_ms, self.log, self.fail_after = name, ms, first_ms, log, fail_after
        self.synced, self.calls = True, 0

    def __call__(self):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory while allocating")
        if self.synced:
            self.log.append(self.name)
            CLOCK.sleep(self.first_ms / 1e3)
        self.synced = False
        CLOCK.sleep(self.ms / 1e3)
        return self

    def sync(self, result):
        result.synced = True
        return result


def _entry(thunk: Clocked):
    return thunk, thunk.sync, "wall"


def test_calls_per_repeat_fill_the_batch() -> None:
    log: list = []
    thunk = Clocked("a", 2.0, log)
    # 2 ms calls, 10 ms repeats: one call is short, so the next batch is sized 1.2 x 10 / 2 = 6 calls
    assert bench.calls_per_repeat(thunk, thunk.sync, "wall", warmup=1, min_batch_ms=10.0) == 6
    # Never fewer than one call, never more than the cap.
    assert bench.calls_per_repeat(thunk, thunk.sync, "wall", warmup=0, min_batch_ms=0.0) == 1
    fast = Clocked("b", 0.0, log)
    assert bench.calls_per_repeat(fast, fast.sync, "wall", warmup=0, min_batch_ms=1e6) == bench.MAX_CALLS_PER_REPEAT


def test_fixed_cost_per_repeat_is_spread_over_the_batch() -> None:
    """1 ms per call plus 20 ms once per repeat: a 2 ms repeat is one call and
    counts the fixed cost in full; 100 ms repeats, sized by growing batches,
    hold 140 calls (batches of 1, 6, 28, 70, 140) and add a seventh.
    (Sizing them from one call's time would pick 5 calls and report 5 ms.)"""
    log: list = []
    thunk = Clocked("a", 1.0, log, first_ms=20.0)
    short = bench.time_interleaved({"a": _entry(thunk)}, warmup=1, iters=3, min_batch_ms=2.0)["a"][0]
    long_ = bench.time_interleaved({"a": _entry(thunk)}, warmup=1, iters=3, min_batch_ms=100.0)["a"][0]
    assert short == pytest.approx(21.0)
    assert long_ == pytest.approx(1.0 + 20.0 / 140)


def test_rounds_rotate_the_order() -> None:
    log: list = []
    entries = {name: _entry(Clocked(name, 0.2, log)) for name in "abc"}
    got = bench.time_interleaved(entries, warmup=0, iters=3, min_batch_ms=0.1)
    assert set(got) == {"a", "b", "c"} and all(isinstance(v, tuple) and v[0] > 0 for v in got.values())
    # Calibration (each entry's batches, in order), then the rounds start one
    # later each time.
    rounds = log[-9:]
    assert rounds == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_a_failing_entry_is_reported_and_the_rest_go_on() -> None:
    ok, oom = Clocked("ok", 0.2, []), Clocked("oom", 0.2, [], fail_after=3)
    got = bench.time_interleaved({"ok": _entry(ok), "oom": _entry(oom)}, warmup=0, iters=4, min_batch_ms=0.1)
    assert isinstance(got["oom"], RuntimeError)
    median, lo, hi = got["ok"]
    assert lo <= median <= hi
    # One call calibrates (it outlasts the batch), then one per round, all
    # four rounds; the failed entry stopped at its failing call.
    assert (ok.calls, oom.calls) == (5, 4)
    assert bench.failure_status(got["oom"], []) == "OOM"


def test_time_ms_raises_the_failure() -> None:
    thunk = Clocked("a", 0.1, [], fail_after=0)
    args = bench_attention.parse_args(["--iters", "2", "--warmup", "0"])
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        bench.time_ms(thunk, thunk.sync, "wall", args)


class Settling:
    """Thunks sharing one fake GPU whose clock follows the last ~10 calls: the
    first `boosted` calls of an entry after another entry ran take `fast_ms`,
    later ones `ms` (a power-limited GPU runs a pass at the clock its
    predecessor left for about 100 ms)."""

    def __init__(self, ms: float = 1.0, fast_ms: float = 0.4, boosted: int = 10):
        self.ms, self.fast_ms, self.boosted = ms, fast_ms, boosted
        self.last, self.run = None, 0

    def entry(self, name: str):
        def thunk():
            self.run = self.run + 1 if self.last == name else 1
            self.last = name
            CLOCK.sleep((self.fast_ms if self.run <= self.boosted else self.ms) / 1e3)
            return None

        return thunk, (lambda result: result), "wall"


def test_lead_in_times_each_entry_at_its_own_steady_state() -> None:
    """Without a lead-in, a repeat that follows another entry is timed at the
    clock that entry left (mostly boosted calls here); with one, the boosted
    calls fall in the untimed lead-in and the median is the steady 4 ms."""
    gpu = Settling(ms=4.0, fast_ms=1.6)
    entries = {name: gpu.entry(name) for name in "abc"}
    plain = bench.time_interleaved(entries, warmup=0, iters=4, min_batch_ms=5.0)
    led = bench.time_interleaved(entries, warmup=0, iters=4, min_batch_ms=5.0, lead_in_ms=60.0)
    for name in "abc":
        assert plain[name][0] == pytest.approx(gpu.fast_ms)  # every timed call boosted
        assert led[name][0] == pytest.approx(gpu.ms)


def test_lead_in_runs_the_same_entry_before_each_timed_repeat() -> None:
    log: list = []
    entries = {name: _entry(Clocked(name, 0.2, log)) for name in "abc"}
    bench.time_interleaved(entries, warmup=0, iters=3, min_batch_ms=0.1, lead_in_ms=2.0)
    runs = [(name, len(list(group))) for name, group in itertools.groupby(log)]
    # Calibration is one run per entry; then each timed repeat comes after
    # untimed repeats of the same entry (a run of at least two repeats), and
    # the rounds still rotate.
    assert [name for name, _ in runs] == ["a", "b", "c"] + ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert all(count >= 2 for _, count in runs[3:])


@pytest.mark.parametrize("value", ["-5", "nan", "soon"])
def test_bad_lead_in_is_refused(capsys, value) -> None:
    """In both entry points that take it: one line naming the option and the fix."""
    from harness import tune_attention

    for parse in (bench_attention.parse_args, tune_attention.parse_args):
        with pytest.raises(SystemExit):
            parse(["--lead-in-ms", value])
        err = capsys.readouterr().err
        assert f"argument --lead-in-ms: must be milliseconds >= 0 (0 turns the lead-in off), got {value!r}" in err
        assert "Traceback" not in err
    assert bench_attention.parse_args([]).lead_in_ms == LEAD_IN_MS
    assert bench_attention.parse_args(["--lead-in-ms", "0"]).lead_in_ms == 0.0
