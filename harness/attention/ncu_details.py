"""Read an Nsight Compute details export and summarize what limits each kernel.

    ncu --csv --page details [--set full | --section ...] -k regex:NAME python ... > kernels.csv
    python -m harness.ncu kernels.csv [--out summary.md]

`read_details` returns one record per profiled launch with every (section, metric) the
export holds; `summary` picks the figures that say whether a kernel is bound by memory,
by issue/latency or by occupancy; rendering is separate. Metrics a section set did not
collect are left out rather than guessed.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

from harness.common.tables import markdown_table

# (label, section, metric name) in the order the summary shows them.
SUMMARY_METRICS = (
    ("duration", "GPU Speed Of Light Throughput", "Duration"),
    ("SM frequency", "GPU Speed Of Light Throughput", "SM Frequency"),
    ("elapsed cycles", "GPU Speed Of Light Throughput", "Elapsed Cycles"),
    ("executed instructions", "Instruction Statistics", "Executed Instructions"),
    ("SM throughput", "GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
    ("memory throughput", "GPU Speed Of Light Throughput", "Memory Throughput"),
    ("DRAM throughput", "GPU Speed Of Light Throughput", "DRAM Throughput"),
    ("SM active / elapsed cycles", None, None),  # derived below
    ("issue slots busy", "Compute Workload Analysis", "Issue Slots Busy"),
    ("registers per thread", "Launch Statistics", "Registers Per Thread"),
    ("dynamic shared memory per block", "Launch Statistics", "Dynamic Shared Memory Per Block"),
    ("waves per SM", "Launch Statistics", "Waves Per SM"),
    ("theoretical occupancy", "Occupancy", "Theoretical Occupancy"),
    ("achieved occupancy", "Occupancy", "Achieved Occupancy"),
    ("block limit (registers)", "Occupancy", "Block Limit Registers"),
    ("block limit (shared memory)", "Occupancy", "Block Limit Shared Mem"),
    ("warp cycles per issued instruction", "Warp State Statistics", "Warp Cycles Per Issued Instruction"),
    ("no eligible warp", "Scheduler Statistics", "No Eligible"),
    ("local-memory spill requests", "Memory Workload Analysis", "Local Memory Spilling Requests"),
    ("L2 hit rate", "Memory Workload Analysis", "L2 Hit Rate"),
    ("tensor pipe active", None, None),  # from --metrics, below
    ("top stalls (cycles per issue)", None, None),
)
# Raw metrics asked for with --metrics land in this section of the export:
#   --metrics 'regex:^sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active$,
#              regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$'
RAW_SECTION = "Command line profiler metrics"
TENSOR_PIPE = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
TOP_STALLS = 3


class NcuError(ValueError):
    pass


@dataclasses.dataclass
class Launch:
    id: str
    kernel: str
    block: str
    grid: str
    metrics: dict[tuple[str, str], tuple[str, str]]  # (section, name) -> (value, unit)

    def value(self, section: str, name: str) -> float | None:
        got = self.metrics.get((section, name))
        if got is None or not got[0].strip():
            return None
        try:
            return float(got[0].replace(",", ""))
        except ValueError:
            return None


def read_details(path: str | Path) -> list[Launch]:
    """Launches of an `ncu --csv --page details` export (ncu's own warning lines skipped)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if len(r) > 10]
    if not rows or rows[0][:1] != ["ID"]:
        raise NcuError(f"{path}: not an ncu details CSV (export with: ncu --csv --page details ...)")
    header = {name: i for i, name in enumerate(rows[0])}
    missing = {"ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"} - set(header)
    if missing:
        raise NcuError(f"{path}: columns {sorted(missing)} missing; export with: ncu --csv --page details ...")
    launches: dict[str, Launch] = {}
    for r in rows[1:]:
        launch = launches.setdefault(r[header["ID"]], Launch(r[header["ID"]], r[header["Kernel Name"]],
                                                             r[header.get("Block Size", 0)], r[header.get("Grid Size",
                                                                                                          0)], {}))
        launch.metrics[(r[header["Section Name"]], r[header["Metric Name"]])] = (r[header["Metric Value"]],
                                                                                 r[header["Metric Unit"]])
    return list(launches.values())


def summary(launch: Launch) -> dict[str, str]:
    """The SUMMARY_METRICS a launch has, formatted with their units."""
    out = {"kernel": launch.kernel, "grid": launch.grid, "block": launch.block}
    derived = _derived(launch)
    for label, section, name in SUMMARY_METRICS:
        if section is None:
            if label in derived:
                out[label] = derived[label]
            continue
        got = launch.metrics.get((section, name))
        if got is not None and got[0].strip():
            value, unit = got
            out[label] = f"{value} {unit}".strip() if unit != "%" else f"{value}%"
    return out


def stalls(launch: Launch) -> list[tuple[str, float]]:
    """(reason, warp cycles stalled per issued instruction), largest first; the
    'selected' state (the cycle a warp issues) is not a stall."""
    out = []
    for (section, name), _ in launch.metrics.items():
        if section == RAW_SECTION and name.startswith(STALL_PREFIX) and name.endswith(STALL_SUFFIX):
            reason = name[len(STALL_PREFIX):-len(STALL_SUFFIX)]
            value = launch.value(section, name)
            if reason != "selected" and value is not None:
                out.append((reason, value))
    return sorted(out, key=lambda x: -x[1])


def _derived(launch: Launch) -> dict[str, str]:
    out = {}
    active = launch.value("GPU Speed Of Light Throughput", "SM Active Cycles")
    elapsed = launch.value("GPU Speed Of Light Throughput", "Elapsed Cycles")
    if active is not None and elapsed:
        out["SM active / elapsed cycles"] = f"{active / elapsed:.0%}"
    tensor = launch.value(RAW_SECTION, TENSOR_PIPE)
    if tensor is not None:
        out["tensor pipe active"] = f"{tensor:g}% of active cycles"
    top = stalls(launch)[:TOP_STALLS]
    if top:
        out["top stalls (cycles per issue)"] = ", ".join(f"{reason} {value:.2f}" for reason, value in top)
    return out


def ncu_markdown(summaries: list[dict[str, str]], source: str) -> str:
    labels = [label for label, _, _ in SUMMARY_METRICS if any(label in s for s in summaries)]
    head = ["metric", *(f"#{i} {s['kernel']}" for i, s in enumerate(summaries))]
    lines = [f"# Nsight Compute summary of `{source}`", "",
             *(f"- #{i}: `{s['kernel']}`, grid {s['grid']}, block {s['block']}" for i, s in enumerate(summaries)), "",
             *markdown_table(head, [[label, *(s.get(label, "-") for s in summaries)] for label in labels])]
    return "\n".join(lines) + "\n"
