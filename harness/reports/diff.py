"""Write a `Diff`: diff.md (the three largest causes in sentences, then tables), diff.json
(schema ``harness.diff/1``) and diff.png (a waterfall from A's step time to B's)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from harness.common.answer import NOISE_WORDS, Finding, answer_markdown, speed
from harness.common.html import with_link
from harness.common.results import atomic_path, write_text
from harness.common.tables import markdown_table
from harness.diffs.changes import changes_sentence
from harness.diffs.decompose import HOST, Diff, PhaseDiff, Throughput, phase_words
from harness.diffs.layers import LayerPhase, layer_sentences
from harness.diffs.repeats import BEYOND_CHANCE, parting_chance
from harness.timing.clocks import MEAN, watts_text

CAUSES = 3


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def step_choice(d: Diff) -> str | None:
    """Which of JAX's two steps `d.step` took, with both times; None where there was no choice."""
    fused, split = d.phase("fused_step"), d.phase("step")
    if not (fused and split):
        return None
    taken, other = (fused, split) if d.step is fused else (split, fused)
    name = {id(fused): "fused step", id(split): "split step"}
    times = "; ".join(f"{label}: {getattr(taken, f'{side}_ms'):.3f} ms against {getattr(other, f'{side}_ms'):.3f} ms"
                      for side, label in (("a", d.a_label), ("b", d.b_label))
                      if getattr(fused, f"{side}_phase") == "fused_step")
    return (f"The step compared is JAX's {name[id(taken)]}, the faster of its two ({times} for its "
            f"{name[id(other)]}, timer medians).")


def _headline(d: Diff, p: PhaseDiff) -> str:
    phase = phase_words(p, d.a_label, d.b_label)
    if not p.a_ms:
        return f"{phase}: no time for A."
    if p.runs:
        ra, rb = p.runs["a"], p.runs["b"]
        chance = parting_chance(len(ra.medians_ms), len(rb.medians_ms))
        noise = {True: "inside the noise (the ranges of the runs' medians overlap)",
                 False: f"beyond the noise (the ranges of the runs' medians do not overlap; {chance:.1%} of orders of "
                        "runs of identical code would part them so)",
                 None: f"noise unknown: the ranges of the runs' medians do not overlap, but {chance:.0%} of orders "
                       "of runs of identical code would part them so; three runs a side can tell"}[p.in_noise]
        return (f"B takes {p.b_ms:.3f} ms per {phase} against A's {p.a_ms:.3f} ms (the median of each side's "
                f"runs' timer medians; B's {len(rb.medians_ms)} runs {rb.lo_ms:.3f}-{rb.hi_ms:.3f} ms, A's "
                f"{len(ra.medians_ms)} runs {ra.lo_ms:.3f}-{ra.hi_ms:.3f} ms): {speed(p.a_ms, p.b_ms)}, {noise}.")
    noise = NOISE_WORDS[p.in_noise]
    return (f"B ({d.b_label}) takes {p.b_ms:.3f} ms per {phase} against A's ({d.a_label}) {p.a_ms:.3f} ms "
            f"({p.whole}): {speed(p.a_ms, p.b_ms)}, {noise}.")


def _cause(p: PhaseDiff, name: str) -> str:
    part = next(x for x in p.parts if x.name == name)
    more = "more" if part.delta_ms > 0 else "less"
    if name == HOST:
        text = (f"Host side: B spends {abs(part.delta_ms):.3f} ms {more} per step with no kernel running "
                f"({part.a_ms:.3f} -> {part.b_ms:.3f} ms; {_num(p.a_kernels)} -> {_num(p.b_kernels)} kernels")
        la, lb = p.launches.get("a"), p.launches.get("b")
        if la and lb:
            text += (f", {la['per_step']:.0f} -> {lb['per_step']:.0f} launch calls at "
                     f"{la['us_per_launch']:.1f} -> {lb['us_per_launch']:.1f} us each")
        return text + ")."
    text = (f"{name} kernels: B spends {abs(part.delta_ms):.3f} ms {more} per step ({part.a_ms:.3f} -> "
            f"{part.b_ms:.3f} ms in {_num(part.a_kernels)} -> {_num(part.b_kernels)} kernels)")
    return text + "".join(f"; {_bound(t)}" for t in p.throughput if t.what == name and _bound(t)) + "."


def _bound(t: Throughput) -> str | None:
    if not (t.a and t.b and t.a_bound and t.b_bound):
        return None
    return (f"B's {t.what} kernels run at {t.b / t.b_bound:.0%} of the {t.bound_name} against A's "
            f"{t.a / t.a_bound:.0%} ({t.a:.1f} -> {t.b:.1f} {t.unit})")


def _overlap_sentence(d: Diff) -> str | None:
    """Each side's exposed communication, where both runs have overlap figures: per compared
    step and as a share of it where the figures say so, else the share of the communication."""
    if not d.overlap:
        return None
    a, b = d.overlap["a"], d.overlap["b"]
    if "step" in a and "step" in b:
        sa, sb = a["step"], b["step"]
        text = (f"Exposed communication per step: B's {sb['phase']} waits {sb['exposed_ms']:.3f} ms for its "
                f"communication ({sb['exposed_share_of_step']:.1%} of the step) against A's {sa['phase']} "
                f"{sa['exposed_ms']:.3f} ms ({sa['exposed_share_of_step']:.1%}), the mean over devices; of the "
                f"communication kernel time over all measured steps {b['exposed_share']:.1%} is exposed against "
                f"{a['exposed_share']:.1%}")
    else:
        text = (f"Exposed communication: {b['exposed_share']:.1%} of B's communication kernel time is not hidden "
                f"under compute against A's {a['exposed_share']:.1%} ({a['exposed_ms']:.3f} of "
                f"{a['communication_ms']:.3f} ms -> {b['exposed_ms']:.3f} of {b['communication_ms']:.3f} ms, "
                "summed over each profile's measured steps)")
    if "waiting_ms_per_step" in a and "waiting_ms_per_step" in b:
        text += (f"; of it, waiting for the last rank {a['waiting_ms_per_step']:.3f} -> {b['waiting_ms_per_step']:.3f}"
                 f" ms and transfer {a['transfer_ms_per_step']:.3f} -> {b['transfer_ms_per_step']:.3f} ms per step "
                 "and device")
    return text + "."


CLOCK_SAME = 0.01  # clocks within this share of each other count as the same


def _power(side: dict) -> str:
    """What the GPU drew while it held that clock, and how often at its power cap, where sampled."""
    watts, capped = side.get("watts"), side.get("capped")
    if watts is None:
        return ""
    text = watts_text({"median": watts, "reading": side.get("reading", MEAN)})
    return f" ({text}" + (f", at the power cap in {capped:.0%} of samples)" if capped is not None else ")")


def clock_sentence(d: Diff) -> str | None:
    """Each side's GPU clock over the compared step, where both sampled it: a GPU-bound step's
    time moves with its clock, so a gap of identical code can be the clock's."""
    if not d.clocks:
        return None
    a, b = d.clocks["a"]["mhz"], d.clocks["b"]["mhz"]
    several = len(d.clocks["a"]["runs"]) > 1
    text = (f"GPU clock over the compared steps: B's median {b:.0f} MHz{_power(d.clocks['b'])} against A's "
            f"{a:.0f} MHz{_power(d.clocks['a'])}" + (" (the median of each side's runs' medians)" if several else ""))
    if abs(b - a) <= CLOCK_SAME * a:
        return text + f": the same within {CLOCK_SAME:.0%}, so the gap is not the clock's."
    slower = b < a
    text += (f": B's {abs(b - a) / a:.1%} {'lower' if slower else 'higher'}; a step bound by the GPU's clock "
             f"takes about that much {'longer' if slower else 'less time'} with the same code")
    p = d.step
    if p is None or p.a_ms <= 0:
        return text + "."
    # The same count of clock cycles at A's clock: what is left of the gap is not the clock's.
    at_a = p.b_ms * b / a
    change = at_a / p.a_ms - 1
    return text + (f"; at A's clock B's would take about {at_a:.3f} ms (its time x B's clock / A's), "
                   f"{abs(change):.1%} {'more' if change > 0 else 'less'} than A's {p.a_ms:.3f} ms.")


def _largest(p: PhaseDiff, n: int) -> list[str]:
    return [part.name for part in sorted(p.parts, key=lambda x: -abs(x.delta_ms))[:n]]


def causes(p: PhaseDiff, n: int = CAUSES) -> list[str]:
    """The `n` largest parts of a phase's gap, as sentences, largest first."""
    return [(c := _cause(p, name))[0].upper() + c[1:] for name in _largest(p, n)]


def sentences(d: Diff) -> list[str]:
    """The headline of the step, its three largest causes and, for data-parallel runs, the
    exposed share of each side's communication."""
    p = d.step
    if p is None:
        return ["The runs have no phase in common.", *layer_sentences(d.layers)]
    unlike = ([f"A and B did different work ({'; '.join(d.different_work)}): the times below are of unlike runs, "
               "and their ratio is no speed-up of one over the other."] if d.different_work else [])
    out = [*unlike, _headline(d, p), *filter(None, [changes_sentence(d.changes), step_choice(d)])]
    out += causes(p)
    named = set(_largest(p, CAUSES))
    out += [f"{line[0].upper()}{line[1:]}." for t in p.throughput if t.what not in named and (line := _bound(t))]
    if line := _overlap_sentence(d):
        out.append(line)
    if line := clock_sentence(d):
        out.append(line)
    if p.residual_ms is not None:
        gap = p.decomposed_gap_ms
        share = abs(p.residual_ms) / abs(gap) if gap else 0.0
        what = ("the gap of the timer's means, which the profile's per-step figures (means over the "
                f"same steps) decompose; the medians' gap is {p.gap_ms:+.3f} ms" if p.a and p.b else "the gap")
        out.append(f"Unexplained: {p.residual_ms:+.3f} ms ({share:.1%} of {gap:+.3f} ms, {what}).")
    return out + layer_sentences(d.layers)


def _layer_lines(lp: LayerPhase) -> list[str]:
    rows = lambda xs: [[x.name, _ms(x.a_ms), _ms(x.b_ms), f"{x.delta_ms:+.3f}"] for x in xs]  # noqa: E731
    return [f"## {lp.phase} by layer (GPU ms per step)", "",
            *markdown_table(["kind", "A ms", "B ms", "B - A ms"], rows(lp.kinds)), "",
            *markdown_table(["layer", "A ms", "B ms", "B - A ms"], rows(lp.layers)), ""]


def _phase_lines(p: PhaseDiff) -> list[str]:
    lines = [f"## {p.phase}" + (f" (A: {p.a_phase}, B: {p.b_phase})" if p.a_phase != p.b_phase else ""), ""]
    spread = lambda t: "-" if t is None else f"{t.median_ms:.3f} [{t.p10_ms:.3f}, {t.p90_ms:.3f}] ±{t.std_ms:.3f}"
    rows = [["median ms [p10, p90] ±std", spread(p.a), spread(p.b),
             f"{p.b.median_ms - p.a.median_ms:+.3f}" if p.runs and p.a and p.b else f"{p.gap_ms:+.3f}"]]
    if p.runs:  # the first row is of one run a side, this one over the runs
        runs = lambda r: f"{r.median_ms:.3f} [{r.lo_ms:.3f}, {r.hi_ms:.3f}] n={len(r.medians_ms)}"  # noqa: E731
        rows.append(["runs' medians: median [min, max]", runs(p.runs["a"]), runs(p.runs["b"]), f"{p.gap_ms:+.3f}"])
    lines += markdown_table(["", "A", "B", "B - A"], rows)
    if not p.parts:
        return [*lines, ""]
    rows = [[x.name, _ms(x.a_ms), _ms(x.b_ms), f"{x.delta_ms:+.3f}", _num(x.a_kernels), _num(x.b_kernels)]
            for x in p.parts]
    rows.append(["residual", "", "", f"{p.residual_ms:+.3f}", "", ""])
    if p.a and p.b:  # the parts decompose the means' gap; the medians' gap is the headline
        rows.append(["whole (timer mean)", _ms(p.a.mean_ms), _ms(p.b.mean_ms), f"{p.decomposed_gap_ms:+.3f}",
                     _num(p.a_kernels), _num(p.b_kernels)])
    counts = ["", ""] if p.a and p.b else [_num(p.a_kernels), _num(p.b_kernels)]
    rows.append(["whole" + (" (timer median)" if p.a and p.b else ""), _ms(p.a_ms), _ms(p.b_ms),
                 f"{p.gap_ms:+.3f}", *counts])
    lines += ["", *markdown_table(["part", "A ms", "B ms", "B - A ms", "A kernels", "B kernels"], rows)]
    movers = [[x.name, m.name[:90], _ms(m.a_ms), _ms(m.b_ms), f"{m.b_ms - m.a_ms:+.3f}", _num(m.a_calls),
               _num(m.b_calls)] for x in p.parts for m in x.movers]
    if movers:
        lines += ["", "Kernels that moved most:", "",
                  *markdown_table(["group", "kernel", "A ms", "B ms", "B - A", "A calls", "B calls"], movers)]
    if p.throughput:
        pct = lambda v, bound: f" ({v / bound:.0%})" if v and bound else ""
        rows = [[t.what, f"{t.a:.1f}{pct(t.a, t.a_bound)}" if t.a else "-",
                 f"{t.b:.1f}{pct(t.b, t.b_bound)}" if t.b else "-", f"{t.unit} vs {t.bound_name} "
                 f"{_num(t.a_bound)} / {_num(t.b_bound)}"] for t in p.throughput]
        lines += ["", *markdown_table(["work", "A", "B", "against"], rows)]
    for side in ("a", "b"):
        gemms = p.gemms.get(side) or []
        if gemms:
            lines += ["", f"GEMMs of {side.upper()} by precision, tile and transposes:", "",
                      *markdown_table(["math", "tile", "transpose", "ms", "calls", "kernel names"],
                                      [[g["math"] or "?", g["tile"] or "?", g["transpose"] or "?", _ms(g["ms"]),
                                        _num(g["calls"]), g["names"]] for g in gemms[:6]])]
    return [*lines, ""]


RULES = ("the step's gap split into the parts the two profiles measure (kernels by category, the host's time with "
         f"no kernel running); the {CAUSES} largest by size are its causes; beyond the noise where the two timers' "
         "p10-p90 ranges do not overlap; unexplained: the gap the parts leave")
RULES_RUNS = ("each side's time the median of its runs' timer medians, beyond the noise where the two ranges of run "
              f"medians do not overlap and at most {BEYOND_CHANCE:.0%} of orders of runs of identical code would part "
              "them so (three runs a side or more); the step's gap of the run nearest each side's median split into "
              "the parts the two profiles measure (kernels by category, the host's time with no kernel running); "
              f"the {CAUSES} largest by size are its causes; unexplained: the gap the parts leave")


def diff_markdown(d: Diff) -> str:
    findings = [Finding("diff", s) for s in sentences(d)]
    several = any(p.runs for p in d.phases)
    title = (f"# {d.b_label} ({len(d.step.runs['b'].medians_ms)} runs) against {d.a_label} "
             f"({len(d.step.runs['a'].medians_ms)} runs)" if several and d.step and d.step.runs
             else f"# {d.b_label} against {d.a_label}")
    lines = [title, "", *answer_markdown(findings, RULES_RUNS if several else RULES)]
    lines += [f"- {label}: {a}" + ("" if a == b else f" / {b}") for label, (a, b) in d.fields.items()]
    lines += ["", *(f"- note: {n}" for n in d.notes), ""] if d.notes else [""]
    for p in d.phases:
        lines += _phase_lines(p)
    for lp in d.layers:
        lines += _layer_lines(lp)
    return "\n".join(lines)


def to_json(d: Diff) -> dict:
    doc = asdict(d)
    for p, pd in zip(d.phases, doc["phases"]):
        pd["gap_ms"] = p.gap_ms
        pd["decomposed_gap_ms"] = p.decomposed_gap_ms
        if p.runs:
            for side, r in p.runs.items():
                pd["runs"][side].update(median_ms=r.median_ms, lo_ms=r.lo_ms, hi_ms=r.hi_ms)
        else:  # one run a side: the document as before several runs could be named
            del pd["runs"]
        for part, jd in zip(p.parts, pd["parts"]):
            jd["delta_ms"] = part.delta_ms
    for lp, jd in zip(d.layers, doc["layers"]):
        for key in ("layers", "kinds"):
            for row, jr in zip(getattr(lp, key), jd[key]):
                jr["delta_ms"] = row.delta_ms
    if not doc["analyses"]:  # none registered beyond the built-in ones: the document as before them
        del doc["analyses"]
    return {"schema": doc.pop("schema"), **doc}


def plot_waterfall(d: Diff, path: Path) -> bool:
    """Bars from A's step time to B's, one per part; False when there are no parts."""
    if not has_waterfall(d):
        return False
    p = d.step
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [(x.name, x.delta_ms) for x in p.parts] + [("residual", p.residual_ms or 0.0)]
    a_ms, b_ms = (p.a.mean_ms, p.b.mean_ms) if p.a and p.b else (p.a_ms, p.b_ms)  # what the parts add up to
    fig, ax = plt.subplots(figsize=(1.1 * (len(steps) + 2) + 2, 4.5))
    ax.bar(0, a_ms, color="0.5")
    level, levels = a_ms, [a_ms, b_ms]
    for i, (_, delta) in enumerate(steps, start=1):
        ax.bar(i, delta, bottom=level, color="tab:red" if delta > 0 else "tab:green")
        level += delta
        levels.append(level)
    ax.bar(len(steps) + 1, b_ms, color="0.5")
    labels = [f"A\n{d.a_label}", *(n for n, _ in steps), f"B\n{d.b_label}"]
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    means = bool(p.a and p.b)
    ax.set_ylabel(f"ms per {p.a_phase if p.a_phase == p.b_phase else 'step'}" + (" (timer mean)" if means else ""))
    ax.set_title(f"{phase_words(p, d.a_label, d.b_label)}: {a_ms:.2f} -> {b_ms:.2f} ms"
                 + (f" (timer means; medians {'over the runs ' if p.runs else ''}{p.a_ms:.2f} -> {p.b_ms:.2f})"
                    if means else ""), fontsize=9)
    ax.set_ylim(min(0.0, *levels) * 1.08, max(levels) * 1.08)  # the tallest bar's top in view
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def has_waterfall(d: Diff) -> bool:
    """Whether `plot_waterfall` draws anything: a compared step split into parts."""
    return d.step is not None and bool(d.step.parts)


def render(d: Diff, out: str | Path, figures: bool = True) -> dict[str, Path]:
    """Write diff.md, diff.json and (with parts to draw, and `figures`) diff.png into folder
    `out`, each whole or not at all."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "diff.md", "json": out / "diff.json"}
    write_text(paths["md"], with_link(diff_markdown(d)))  # the page's link in the same write (`write_diff`)
    write_text(paths["json"], json.dumps(to_json(d), indent=1))
    if figures:
        with atomic_path(out / "diff.png") as png:
            if plot_waterfall(d, Path(png)):
                paths["png"] = out / "diff.png"
    return paths
