"""`harness.held_signals`: a stop signal that lands while a result is written waits for the
block to finish, then arrives once, whatever other threads the process runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from harness import Terminated, _terminated, held_signals


def _other_thread() -> threading.Event:
    """A thread alive across the block, started before it (so a per-thread signal mask set in
    the block does not cover it): the kernel may hand it a process-directed signal."""
    stop = threading.Event()
    threading.Thread(target=stop.wait, daemon=True).start()
    return stop


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_in_the_block_arrives_after_it(signum) -> None:
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGTERM, _terminated)  # as a started tool has it
    # Python's own Ctrl-C handler, which it leaves unset where the process was started with
    # SIGINT ignored (a background job of a shell without job control)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stop = _other_thread()
    finished = []
    try:
        with pytest.raises(KeyboardInterrupt) as raised:
            with held_signals():
                os.kill(os.getpid(), signum)
                time.sleep(0.2)  # bytecode runs on: a handler that raised would have by now
                finished.append(True)
        assert finished == [True]
        assert isinstance(raised.value, Terminated) == (signum == signal.SIGTERM)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        stop.set()
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])


def test_nothing_held_nothing_raised_and_an_ignored_signal_stays_ignored() -> None:
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with held_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


def _starts(caller: str, tmp_path):
    """A call of `caller` that starts one child process (which the test replaces by a sleep)."""
    if caller == "compare":
        from harness.runs import compare

        return lambda: compare._stream([sys.executable, "-c", "pass"], dict(os.environ))
    if caller == "sweep cell":
        from harness.runs import sweep
        from harness.sweeps.records import Cell

        opts = dict(batch=1, warmup=0, steps=1, attention="naive", mode="train", device="cpu", nsys=False,
                    optimizer="foreach")
        return lambda: sweep.run_cell(Cell("tiny", 16, "torch", "fp32"), opts, str(tmp_path))
    if caller == "sweep loop":
        from harness.runs import sweep
        from harness.sweeps.records import Cell

        opts = dict(batch=1, warmup=0, steps=1, attention="naive", mode="train", device="cpu", nsys=False,
                    optimizer="foreach")
        return lambda: sweep.run_sweep([Cell("tiny", 16, "torch", "fp32")], opts, str(tmp_path), log=lambda m: None)
    if caller == "bench_report":
        from harness import bench_report

        return lambda: bench_report._timed([sys.executable, "-c", "pass"])
    from harness import bench_ranks

    return lambda: bench_ranks.run_report(tmp_path, tmp_path / "out")


@pytest.mark.parametrize("caller", ["compare", "sweep cell", "sweep loop", "bench_report", "bench_ranks"])
def test_a_signal_while_a_child_starts_stops_that_child(caller, tmp_path, monkeypatch) -> None:
    """A signal landing inside Popen, after the fork (the window a stop right after a tool starts
    a child falls in), must not leave the started child running, unseen by the tool."""
    started = []
    real = subprocess.Popen

    def popen(args, **kwargs):
        started.append(real([sys.executable, "-c", "import time; time.sleep(60)"], **kwargs))
        signal.raise_signal(signal.SIGINT)  # before Popen has returned the child to its caller
        return started[-1]

    call = _starts(caller, tmp_path)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(subprocess, "Popen", popen)
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        signal.signal(signal.SIGINT, previous)
        left_running = [proc.pid for proc in started if proc.poll() is None]
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert len(started) == 1 and left_running == []
