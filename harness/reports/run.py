"""A run's result document as terminal text: the phase table, outliers, data-parallel figures."""

from __future__ import annotations

from harness import backends
from harness.backends.parallel import parallel_label
from harness.common.documents import RunDocument
from harness.common.stats import cell, figure, times_the_median
from harness.timing.clocks import time_clock_r, watts_text


def format_result(doc: dict) -> str:
    run = RunDocument.from_dict(doc, need_schema=False)
    o = run.options
    head = (f"{o['backend']} {o['model']} ctx {o['ctx']} batch {o['batch']} {o['dtype']} {o['attention']} "
            f"{o['mode']} on {o['device']}")
    if not run.ok:
        return f"{head}: FAILED: {run.message}"
    n = o.get("data_parallel", 1)
    head += f", {n} devices (TFLOP/s and MFU per device)" if n > 1 else ""
    lines = [head]
    if len((doc.get("data_parallel") or {}).get("ranks") or ()) > 1:  # each rank timed its own phases
        lines.append("rank 0's phases (the data-parallel step below is the slowest rank's median):")
    lines.append(f"{'phase':<11} {'median ms (p10-p90)':>26} {'TFLOP/s':>8} {'MFU':>6} {'peak MiB':>9}")
    for name, p in doc["phases"].items():
        tf = figure(p["tflops"])
        mfu = f"{100 * p['mfu']:.1f}%" if p["mfu"] else "-"
        mem = f"{p['peak_memory_bytes'] / 2**20:.0f}" if p["peak_memory_bytes"] else "-"
        lines.append(f"{name:<11} {cell(p):>26} {tf:>8} {mfu:>6} {mem:>9}")
    lines += outlier_lines(doc)
    lines += clock_lines(doc)
    first = doc.get("first_step")
    if first:
        step_ms = first["time_to_first_step_ms"] - first["setup_ms"]
        lines.append(f"time to first step: {first['time_to_first_step_ms'] / 1e3:.2f} s "
                     f"(setup {first['setup_ms'] / 1e3:.2f} s + first step {step_ms / 1e3:.2f} s)")
    if ov := doc.get("overhead"):
        lines.append(f"instrumentation overhead: {ov['ratio']:.3f}x plain steps "
                     f"(rounds {min(ov['round_ratios']):.3f}-{max(ov['round_ratios']):.3f})"
                     + (f": {ov['flag']}" if ov.get("flag") else ""))
    if (layers := doc.get("layer_ranges")) and layers.get("overhead_ratio"):
        lines.append(f"layer ranges: {layers['overhead_ratio']:.3f}x the step without them "
                     f"(rounds {min(layers['round_ratios']):.3f}-{max(layers['round_ratios']):.3f})"
                     + (f": {layers['flag']}" if layers.get("flag") else ""))
    lines += [f"warning: {w}" for w in other_warnings(doc)]
    return "\n".join(lines)


FOLLOWS_CLOCK = -0.7  # a correlation of call time with clock at or below this: the spread is the clock's


def clock_text(rec: dict, boost_mhz: float | None, times_ms: list[float] | None = None) -> str | None:
    """A phase's GPU clock record (`harness.timing.clocks`) in words, None where it holds no sample:
    "1710 MHz median (1650-1980), 690 W, at the power cap in 85% of samples; MFU at that clock 56.1%
    (the datasheet peak's clock: 1830 MHz); its calls' times follow the clock (r = -0.93 ...)",
    the last part where the phase's call times `times_ms` are given and correlate."""
    if not rec.get("samples"):
        return None
    mhz, watts = rec["sm_mhz"], rec.get("power_w")
    text = f"{mhz['median']:.0f} MHz median ({mhz['min']}-{mhz['max']})"
    text += f", {watts_text(watts)}" if watts else ""
    causes = [f"at the power cap in {rec['power_capped']:.0%}" if rec.get("power_capped") else "",
              f"in a thermal slowdown in {rec['thermal']:.0%}" if rec.get("thermal") else ""]
    text += f", {' and '.join(c for c in causes if c)} of samples" if any(causes) else ""
    if rec.get("mfu_at_clock"):
        text += f"; MFU at that clock {rec['mfu_at_clock']:.1%} (the datasheet peak's clock: {boost_mhz:.0f} MHz)"
    if (r := time_clock_r(times_ms or [], rec.get("call_mhz") or [])) is not None:
        calls = sum(m is not None for m in rec["call_mhz"])
        text += (f"; its calls' spread follows the clock (r = {r:.2f} between time and clock over {calls} calls)"
                 if r <= FOLLOWS_CLOCK else f"; r = {r:.2f} between its calls' time and clock ({calls} calls)")
    return text


def clock_lines(doc: dict) -> list[str]:
    """The GPU clock over the measured steps (the split and the fused step), or why it was not
    sampled; nothing for a CPU run. A run of one process per device shows rank 0's."""
    clocks = doc.get("gpu_clocks")
    if not clocks:
        return []
    if reason := clocks.get("not_sampled"):
        return [f"GPU clock: {reason}"]
    lines = []
    whose = "rank 0's GPU" if len(doc.get("ranks") or ()) > 1 else "GPU"  # each rank's is in `ranks`
    for name in ("step", "fused_step"):
        rec = clocks["phases"].get(name)
        if rec is not None:
            text = clock_text(rec, clocks.get("boost_mhz"), (doc["phases"].get(name) or {}).get("times_ms"))
            lines.append(f"{whose} clock over the measured {name} calls: "
                         + (text or "no sample (each call shorter than the sampling period)"))
    return lines


def other_warnings(doc: dict) -> list[str]:
    """The run's warnings less the overhead flags, which the overhead lines carry already
    (printed twice, the second time as a warning, they read as two problems)."""
    shown = {f"instrumentation overhead: {(doc.get('overhead') or {}).get('flag')}",
             f"layer ranges overhead: {(doc.get('layer_ranges') or {}).get('flag')}"}
    return [w for w in doc.get("warnings", []) if w not in shown]


def outlier_lines(doc: dict) -> list[str]:
    """One line per outlier step of a result document: phase, index, time, cause."""
    return [f"outlier: {name}, measured step {o['index']}: {o['ms']:.2f} ms ({times_the_median(o['x_median'])})"
            + (f": {'; '.join(o['causes'])}" if o.get("causes") else "")
            for name, p in doc.get("phases", {}).items() for o in p.get("outliers", [])]


def format_data_parallel(doc: dict) -> list[str]:
    """The data-parallel lines under a run's table: global step, tokens/s, per-rank spread,
    the link's bandwidth and the ranks' waiting where measured."""
    dp = doc.get("data_parallel")
    if not dp:
        return []
    backend = (doc.get("options") or {}).get("backend") or backends.reference()  # none recorded: the reference's
    label = dp.get("label") or parallel_label(backend, dp["parallel"])
    if dp.get("bucket_mb"):
        label += f", {dp['bucket_mb']:g} MB buckets"
    lines = [f"data-parallel {dp['n']} ({label}), global batch {dp['global_batch']}: step "
             f"{dp['step_ms']:.3f} ms, {dp['tokens_per_s']:.0f} tokens/s"]
    if len(dp["ranks"]) > 1:
        lines += [f"  {name:<10} per-rank medians {s['min_ms']:.3f}-{s['max_ms']:.3f} ms, "
                  f"straggler {s['straggler']:.3f}x (slowest rank {s['slowest_rank']})"
                  for name, s in dp["spread"].items()]
    else:
        lines.append(f"  {dp['note']}")
    if link := dp.get("link"):
        lines.append(f"  link: all-reduce of {link['bytes'] / 1e6:.1f} MB in {link['median_ms']:.3f} ms, "
                     f"bus bandwidth {link['busbw_gbps']:.1f} GB/s ({link['backend']})")
    if dp["parallel"] == "fsdp" and len(dp["ranks"]) > 1:  # also where an older document carries a split
        lines.append("  waiting and transfer: FSDP2's collectives run inside the forward and the backward, where "
                     "host timings cannot tell waiting from computing; profile with --nsys to split them")
    elif split := dp.get("host_split"):
        waits = ", ".join(f"rank {r['rank']} {r['waiting_ms_per_step']:.3f}" for r in split["ranks"])
        late = f", late from its {split['late_phase']}" if split.get("late_phase") else ""
        lines.append(f"  waiting per step in the backward's all-reduce (host timings): {waits} ms; last to arrive: "
                     f"rank {split['last_rank']} in {100 * split['last_share']:.0f}% of steps{late}")
    return lines
