"""Compute HTA's figures on the traces beside this file and store them in hta_figures.json.

A development-time script, run once by hand where HolisticTraceAnalysis is installed
(`pip install HolisticTraceAnalysis`); neither the product nor the tests import HTA:
the tests compare with the stored JSON. Each trace is analysed alone, as its own rank
set, with HTA's default scope (the last ProfilerStep and GPU events without a launch in
the trace left out).

    python tests/data/hta/hta_figures.py
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import tempfile
from pathlib import Path

from hta.trace_analysis import TraceAnalysis

HERE = Path(__file__).parent
SETS = {"sampled": ["sampled_rank-0.json.gz", "sampled_rank-1.json.gz"],
        "negative_queue": ["negative_queue_rank0.json.gz"],
        "ns_resolution": ["ns_resolution_rank0.json.gz"],
        "mi250": ["mi250_rocm.json.gz"],
        "event_sync": ["event_sync.json.gz"],
        "event_sync_multi_stream": ["event_sync_multi_stream.json.gz"],
        "alexnet": ["alexnet.json.gz"],
        "trace_compare_base": ["trace_compare_base.json.gz"],
        "one_step": ["trace_compare_base_one_step.json.gz"]}


def figures(files: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            shutil.copy(HERE / f, Path(tmp) / f)
        ta = TraceAnalysis(trace_dir=tmp)
        ranks = ta.t.get_ranks()
        out: dict = {"ranks": ranks, "temporal": {}, "overlap": {}, "launch": {}, "queue": {}, "kernels": {}}
        for row in ta.get_temporal_breakdown(visualize=False).to_dict("records"):
            out["temporal"][int(row["rank"])] = {k: float(v) for k, v in row.items() if k != "rank"}
        for row in ta.get_comm_comp_overlap(visualize=False).to_dict("records"):
            out["overlap"][int(row["rank"])] = float(row["comp_comm_overlap_pctg"]) / 100
        for rank, df in ta.get_cuda_kernel_launch_stats(ranks=ranks, visualize=False).items():
            out["launch"][int(rank)] = {
                "events": len(df), "launch_delay_sum": float(df["launch_delay"].sum()),
                "cpu_duration_sum": float(df["cpu_duration"].sum()),
                "gpu_duration_sum": float(df["gpu_duration"].sum()),
                "gpu_shorter_than_cpu": int((df["gpu_duration"] < df["cpu_duration"]).sum()),
                "runtime_over_50us": int((df["cpu_duration"] > 50).sum()),
                "launch_delay_over_100us": int((df["launch_delay"] > 100).sum())}
        summary = ta.get_queue_length_summary(ranks=ranks)
        if summary is not None:
            for (rank, stream), row in summary.iterrows():
                out["queue"].setdefault(int(rank), {})[int(stream)] = {
                    "count": int(row[("queue_length", "count")]), "max": float(row[("queue_length", "max")]),
                    "mean": float(row[("queue_length", "mean")])}
        for rank in ranks:
            df = ta.t.get_trace(rank)
            gpu = df[df["stream"].ne(-1)]
            out["kernels"][int(rank)] = {"events": len(gpu), "dur_sum": float(gpu["dur"].sum())}
        return out


def main() -> None:
    doc = {"hta_version": importlib.metadata.version("HolisticTraceAnalysis"),
           "units": "µs as HTA reports them; ratios as fractions",
           "sets": {name: figures(files) for name, files in SETS.items()}}
    (HERE / "hta_figures.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
