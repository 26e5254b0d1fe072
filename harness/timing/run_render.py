"""A run's result document as terminal text: the phase table, outliers, data-parallel figures."""

from __future__ import annotations

from harness.common.stats import cell


def format_result(doc: dict) -> str:
    o = doc["options"]
    head = (f"{o['backend']} {o['model']} ctx {o['ctx']} batch {o['batch']} {o['dtype']} {o['attention']} "
            f"{o['mode']} on {o['device']}")
    if doc["status"] != "ok":
        return f"{head}: FAILED: {doc['error']['message']}"
    lines = [head, f"{'phase':<11} {'median ms (p10-p90)':>26} {'TFLOP/s':>8} {'MFU':>6} {'peak MiB':>9}"]
    for name, p in doc["phases"].items():
        tf = f"{p['tflops']:.2f}" if p["tflops"] else "-"
        mfu = f"{100 * p['mfu']:.1f}%" if p["mfu"] else "-"
        mem = f"{p['peak_memory_bytes'] / 2**20:.0f}" if p["peak_memory_bytes"] else "-"
        lines.append(f"{name:<11} {cell(p):>26} {tf:>8} {mfu:>6} {mem:>9}")
    lines += outlier_lines(doc)
    first = doc.get("first_step")
    if first:
        step_ms = first["time_to_first_step_ms"] - first["setup_ms"]
        lines.append(f"time to first step: {first['time_to_first_step_ms'] / 1e3:.2f} s "
                     f"(setup {first['setup_ms'] / 1e3:.2f} s + first step {step_ms / 1e3:.2f} s)")
    if doc.get("overhead"):
        lines.append(f"instrumentation overhead: {doc['overhead']['ratio']:.3f}x plain steps "
                     f"(rounds {min(doc['overhead']['round_ratios']):.3f}-{max(doc['overhead']['round_ratios']):.3f})")
    if (layers := doc.get("layer_ranges")) and layers.get("overhead_ratio"):
        lines.append(f"layer ranges: {layers['overhead_ratio']:.3f}x the step without them "
                     f"(rounds {min(layers['round_ratios']):.3f}-{max(layers['round_ratios']):.3f})")
    lines += [f"warning: {w}" for w in doc.get("warnings", [])]
    return "\n".join(lines)


def outlier_lines(doc: dict) -> list[str]:
    """One line per outlier step of a result document: phase, index, time, cause."""
    return [f"outlier: {name}, measured step {o['index']}: {o['ms']:.2f} ms ({o['x_median']:.1f}x the median)"
            + (f": {'; '.join(o['causes'])}" if o.get("causes") else "")
            for name, p in doc.get("phases", {}).items() for o in p.get("outliers", [])]


def format_data_parallel(doc: dict) -> list[str]:
    """The data-parallel lines under a run's table: global step, tokens/s, per-rank spread."""
    dp = doc.get("data_parallel")
    if not dp:
        return []
    lines = [f"data-parallel {dp['n']} ({dp['parallel']}), global batch {dp['global_batch']}: step "
             f"{dp['step_ms']:.3f} ms, {dp['tokens_per_s']:.0f} tokens/s"]
    if len(dp["ranks"]) > 1:
        lines += [f"  {name:<10} per-rank medians {s['min_ms']:.3f}-{s['max_ms']:.3f} ms, "
                  f"straggler {s['straggler']:.3f}x (slowest rank {s['slowest_rank']})"
                  for name, s in dp["spread"].items()]
    else:
        lines.append(f"  {dp['note']}")
    return lines
