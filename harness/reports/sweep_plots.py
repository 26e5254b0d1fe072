"""The plots of a sweep's report: step time against context, phases per cell, peak memory.

Each `*_figure` function builds a matplotlib figure from the analysis (None when there is
nothing to draw), and `plot_*` writes it. Every value axis carries labelled ticks: a log
axis only where the values span at least a decade (below that, a log axis can hold no
labelled tick at all), else a linear one.
"""

from __future__ import annotations

GIB = 2**30
LOG_SPAN = 10  # values spanning at least this factor get a log axis
MARKERS = "osD^vP*X"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _subplots(n: int):
    fig, axes = _pyplot().subplots(1, n, figsize=(4.5 * n, 3.6), squeeze=False)
    return fig, axes[0]


def _save(fig, path: str) -> bool:
    if fig is None:
        return False
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return True


def _models(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["model"] for r in rows))


def groups(rows: list[dict], *keys: str) -> dict[tuple, list[dict]]:
    """`rows` grouped by the values of `keys`, in first-seen order."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def _label(backend: str, dtype: str, batch: int, batches: list[int]) -> str:
    return f"{backend} {dtype}" + (f" b{batch}" if len(batches) > 1 else "")


def _ctx_axis(ax, rows: list[dict]) -> None:
    """A log x axis whose ticks are the measured context lengths, labelled."""
    from matplotlib.ticker import NullLocator

    ctxs = sorted({r["ctx"] for r in rows})
    ax.set_xscale("log")
    ax.set_xticks(ctxs, [str(c) for c in ctxs])
    ax.xaxis.set_minor_locator(NullLocator())


def value_axis(ax, values: list[float]) -> None:
    """The y axis for `values`: log with labelled 1-2-5 ticks when they span a decade or
    more, linear otherwise."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    positive = [v for v in values if v > 0]
    if not positive or max(positive) / min(positive) < LOG_SPAN:
        return
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_locator(NullLocator())


def has_time(data: dict) -> bool:
    """Whether `time_figure` draws anything (a cell with a step time); `has_phases` and
    `has_memory` likewise, so that a report rendered without its figures names the same plots."""
    return any(r["step"] for r in data["phases"])


def has_phases(data: dict) -> bool:
    return any(r["forward"] for r in data["phases"])


def has_memory(data: dict) -> bool:
    return bool(data["memory"])


def time_figure(data: dict):
    """Per model: step time against context, one colour per backend (the same in every
    panel), one marker per dtype and batch, solid for the step and dashed for JAX's fused step."""
    rows = data["phases"]
    if not has_time(data):
        return None
    models = _models(rows)
    colours = {b: f"C{i}" for i, b in enumerate(dict.fromkeys(r["backend"] for r in rows))}
    markers = {k: MARKERS[i % len(MARKERS)] for i, k in enumerate(dict.fromkeys((r["dtype"], r["batch"])
                                                                                 for r in rows))}
    fig, axes = _subplots(len(models))
    for ax, model in zip(axes, models):
        mine = [r for r in rows if r["model"] == model]
        values = []
        for (backend, dtype, batch), rs in groups(mine, "backend", "dtype", "batch").items():
            for phase, line in (("step", "-"), ("fused_step", "--")):
                pts = [(r["ctx"], r[phase]["median_ms"]) for r in rs if r[phase]]
                if pts:
                    values += [ms for _, ms in pts]
                    label = _label(backend, dtype, batch, data["batches"])
                    ax.plot(*zip(*pts), linestyle=line, marker=markers[dtype, batch], color=colours[backend],
                            label=label + (" fused" if phase == "fused_step" else ""))
        ax.set(title=model, xlabel="context length", ylabel="step ms (median)")
        _ctx_axis(ax, mine)
        value_axis(ax, values)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return fig


def phase_figure(data: dict):
    rows = [r for r in data["phases"] if r["forward"]]
    if not has_phases(data):
        return None
    fig, (ax,) = _subplots(1)
    fig.set_size_inches(max(6.0, 0.45 * len(rows)), 4.2)
    bottom = [0.0] * len(rows)
    for phase in ("forward", "backward", "optimizer"):
        vals = [(r[phase] or {}).get("median_ms", 0.0) for r in rows]
        ax.bar(range(len(rows)), vals, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, vals)]
    batch = (lambda r: f"/b{r['batch']}") if len(data["batches"]) > 1 else (lambda r: "")
    ax.set_xticks(range(len(rows)), [f"{r['model']}/{r['ctx']}{batch(r)}/{r['backend']}/{r['dtype']}"
                                     for r in rows], rotation=75, fontsize=7)
    ax.set(ylabel="ms (median)", title="phases per cell")
    ax.legend(fontsize=7)
    return fig


def memory_figure(data: dict):
    """Per model: the predicted step peak against context (lines, per dtype and batch) and
    each backend's measured step peak (markers), with the device memory when near."""
    rows = data["memory"]
    if not has_memory(data):
        return None
    models = _models(rows)
    fig, axes = _subplots(len(models))
    for ax, model in zip(axes, models):
        mine = [r for r in rows if r["model"] == model]
        for (dtype, batch), rs in groups(mine, "dtype", "batch").items():
            pts = sorted({(r["ctx"], r["step"]["predicted"] / GIB) for r in rs})
            suffix = f" b{batch}" if len(data["batches"]) > 1 else ""
            ax.plot(*zip(*pts), "-", label=f"predicted (torch) {dtype}{suffix}")
        measured = groups([r for r in mine if r["step"]["measured"]], "backend", "dtype", "batch")
        for marker, ((backend, dtype, batch), rs) in zip(MARKERS * len(measured), measured.items()):
            pts = sorted((r["ctx"], r["step"]["measured"] / GIB) for r in rs)
            ax.plot(*zip(*pts), marker, linestyle="none", fillstyle="none",
                    label=f"measured {_label(backend, dtype, batch, data['batches'])}")
        device = data["device_memory"]["bytes"] / GIB
        if max(max(r["step"]["predicted"], r["step"]["measured"] or 0) for r in mine) / GIB > device / 4:
            ax.axhline(device, color="grey", linestyle=":", label="device memory")
        ax.set(title=model, xlabel="context length", ylabel="peak GiB (step)")
        ax.set_ylim(bottom=0)  # peaks are sizes: from zero, so near-equal ones look near-equal
        _ctx_axis(ax, mine)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return fig


def plot_time_vs_ctx(data: dict, path: str) -> bool:
    return _save(time_figure(data), path)


def plot_phase_bars(data: dict, path: str) -> bool:
    return _save(phase_figure(data), path)


def plot_memory(data: dict, path: str) -> bool:
    return _save(memory_figure(data), path)
