"""Host events during timed steps, so that a slow step can name its cause.

Records Python garbage collections (``gc.callbacks``), JAX compilations and cache
lookups (``jax.monitoring`` duration events) and torch.compile compilations
(``torch._dynamo.callback``), each with its interval on the ``time.perf_counter``
clock the timer uses. `EventLog.between` returns the events that overlap a timed
interval.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

# jax.monitoring duration events that are host time spent compiling: tracing, lowering and
# the backend's compilation ("/jax/core/compile/..."), and a persistent-cache lookup. Not
# "/jax/compilation_cache/compile_time_saved_sec": on a cache hit it reports the compile time
# the hit saved, which was never spent in this process.
_JAX_SPENT_PREFIX = "/jax/core/compile/"
_JAX_CACHE_LOOKUP = "/jax/compilation_cache/cache_retrieval_time_sec"


@dataclass(frozen=True)
class Event:
    kind: str  # "gc", "compile"
    detail: str
    start: float  # perf_counter seconds
    end: float

    def describe(self) -> str:
        return f"{self.kind} {self.detail} {1e3 * (self.end - self.start):.1f} ms"


class EventLog:
    """A context manager that records host events until it exits."""

    def __init__(self, compile_events: str | None):
        """`compile_events`: whose compilations to record (`Backend.compile_events`):
        "jax.monitoring", "dynamo" or None (collections only)."""
        self.compile_events = compile_events
        self.events: list[Event] = []
        self._gc_start: float | None = None
        self._undo: list = []

    def _on_gc(self, phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._gc_start = now
        elif self._gc_start is not None:
            self.events.append(Event("gc", f"gen{info['generation']}", self._gc_start, now))
            self._gc_start = None

    def __enter__(self) -> EventLog:
        gc.callbacks.append(self._on_gc)
        self._undo.append(lambda: gc.callbacks.remove(self._on_gc))
        watch = {"jax.monitoring": self._watch_jax, "dynamo": self._watch_dynamo}.get(self.compile_events)
        if watch is not None:
            watch()
        return self

    def __exit__(self, *exc) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def _watch_jax(self) -> None:
        import jax.monitoring

        def on_duration(name: str, seconds: float, **_) -> None:
            if name.startswith(_JAX_SPENT_PREFIX) or name == _JAX_CACHE_LOOKUP:
                end = time.perf_counter()
                self.events.append(Event("compile", name.rsplit("/", 1)[-1], end - seconds, end))

        jax.monitoring.register_event_duration_secs_listener(on_duration)
        self._undo.append(lambda: jax.monitoring.unregister_event_duration_listener(on_duration))

    def _watch_dynamo(self) -> None:
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:  # older torch: compilations are not reported
            return
        starts: dict[str, float] = {}

        def on_start(args) -> None:
            starts[str(getattr(args, "compile_id", ""))] = time.perf_counter()

        def on_end(args) -> None:
            key = str(getattr(args, "compile_id", ""))
            start = starts.pop(key, None)
            if start is not None:
                self.events.append(Event("compile", f"torch.compile {key}".strip(), start, time.perf_counter()))

        callback_handler.register_start_callback(on_start)
        callback_handler.register_end_callback(on_end)
        self._undo.append(lambda: callback_handler.remove_start_callback(on_start))
        self._undo.append(lambda: callback_handler.remove_end_callback(on_end))

    def between(self, start: float, end: float, min_ms: float = 0.5) -> list[Event]:
        """Events overlapping ``[start, end]`` that lasted at least `min_ms`."""
        return [e for e in self.events if e.end >= start and e.start <= end and 1e3 * (e.end - e.start) >= min_ms]
