"""Layer ranges on a torch session, and what they cost."""

from __future__ import annotations

import statistics

from harness.backends.ranges import install_layer_ranges
from harness.timing.timer import OVERHEAD_ROUNDS, Timer, overhead_flag


class LayerRanges:
    """The layer ranges of a session with `layer_modules` (`install_layer_ranges`), on from
    construction; `overhead` measures what they cost."""

    def __init__(self, session) -> None:
        self.session = session
        self.handles = install_layer_ranges(session.layer_modules())

    def _set(self, on: bool) -> None:
        for h in self.handles:
            h.remove()
        self.handles = install_layer_ranges(self.session.layer_modules()) if on else []

    def overhead(self, timer: Timer, phases: tuple[str, ...]) -> dict:
        """Steps with layer ranges against the same steps without, like with like: the
        timer's instrumented steps (phase ranges, a sync after each phase) in interleaved
        rounds of the same number of steps, which of the two goes first alternating by
        round (`Timer.rounds`); the ratio of the medians of the round means. The steps run
        under `warmup` ranges, so a profile keeps them out of its figures. The ranges are
        off afterwards."""
        n = timer.steps_per_round

        def steps(count: int) -> None:
            for _ in range(count):
                timer.step(phases, False, "step")

        means = timer.rounds({"with": steps, "without": steps}, "layer ranges", alternate=True,
                             before=lambda key: self._set(key == "with"))
        self._set(False)
        with_ms, without_ms = statistics.median(means["with"]), statistics.median(means["without"])
        ratios = [a / b for a, b in zip(means["with"], means["without"])]
        flag = overhead_flag(with_ms / without_ms, ratios, "steps with layer ranges", "steps without")
        return {"overhead_ratio": with_ms / without_ms, "with_ms": with_ms, "without_ms": without_ms,
                **({"flag": flag} if flag else {}), "round_ratios": ratios, "rounds": OVERHEAD_ROUNDS,
                "steps_per_round": n,
                "method": (f"NVTX ranges per block and sub-module from module hooks (forward) and pre-hooks on "
                           f"the forward's autograd nodes (backward), no synchronization; {n} timed steps with "
                           f"them vs {n} without, in {OVERHEAD_ROUNDS} interleaved rounds (order alternating); "
                           "medians of the round means"),
                "note": "the phase times of this run were measured with the layer ranges on"}
