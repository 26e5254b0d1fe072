"""Roofline of the kernels in an Nsight Compute details export: each kernel's achieved
FLOP/s against its arithmetic intensity (FLOPs per DRAM byte), under the GPU's compute
roofs (dense f16/bf16 tensor peak, fp32) and memory roof (DRAM bandwidth).

Capture (a GEMM or any kernel; the raw metrics land in the export's "Command line
profiler metrics" section):

    ncu --csv --page details --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        --section LaunchStats --metrics {METRICS} -k regex:gemm python ... > k.csv

What each figure is made of, per launch:
- time: ``Duration`` (SpeedOfLight);
- DRAM bytes: ``dram__bytes_read.sum`` + ``dram__bytes_write.sum`` where collected, else
  MemoryWorkloadAnalysis's ``Memory Throughput`` (dram__bytes.sum.per_second) x time;
- tensor FLOPs: tensor-pipe active cycles (``sm__pipe_tensor_cycles_active`` as % of SM
  active cycles x ``SM Active Cycles`` x ``# SMs``) x the dense f16/bf16 MMA rate per SM
  cycle of the architecture (`harness.common.hardware.sm_tensor_flops`): exact for full-rate f16/bf16
  MMAs, an overestimate for tf32/fp8 or partly idle pipes;
- CUDA-core FLOPs: ``smsp__sass_thread_inst_executed_op_{f,h,d}{fma,add,mul}_pred_on.sum``
  (an FMA counts 2) where collected.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from harness.attention.ncu_details import RAW_SECTION, Launch, NcuError
from harness.common.hardware import hbm_tbps, peak_tflops, sm_tensor_flops
from harness.common.tables import markdown_table

SOL, MEMORY, LAUNCH = "GPU Speed Of Light Throughput", "Memory Workload Analysis", "Launch Statistics"
TENSOR_PIPE = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
CORE_OPS = {f"smsp__sass_thread_inst_executed_op_{p}{op}_pred_on.sum": 2 if op == "fma" else 1
            for p in "fhd" for op in ("fma", "add", "mul")}
DRAM_BYTES = ("dram__bytes_read.sum", "dram__bytes_write.sum")
METRICS = ",".join((TENSOR_PIPE, *DRAM_BYTES, *CORE_OPS))
__doc__ = __doc__.replace("{METRICS}", METRICS)
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME = {"ns": 1e-9, "nsecond": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3, "s": 1.0,
         "second": 1.0}


@dataclass
class Point:
    id: str
    kernel: str
    seconds: float
    flops: float
    dram_bytes: float
    sources: list[str]  # which metrics made the figures

    @property
    def intensity(self) -> float:
        return self.flops / self.dram_bytes if self.dram_bytes else float("inf")

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds


@dataclass
class Roofs:
    gpu: str
    tensor_tflops: float  # dense bf16/f16
    fp32_tflops: float
    dram_tbps: float

    def ridge(self, tflops: float) -> float:
        """FLOP per byte where the memory roof meets a compute roof."""
        return tflops / self.dram_tbps

    def roof(self, intensity: float, tflops: float) -> float:
        return min(tflops * 1e12, intensity * self.dram_tbps * 1e12)


def roofs(gpu: str) -> Roofs:
    """The roofs of `gpu` (a name in harness.common.hardware's tables, e.g. "H100", "H200")."""
    tensor, fp32, bw = peak_tflops(gpu, "bf16"), peak_tflops(gpu, "fp32"), hbm_tbps(gpu)
    if not (tensor and fp32 and bw):
        raise NcuError(f"--gpu {gpu!r}: not in the peak and bandwidth tables (harness/common/hardware.py)")
    return Roofs(gpu, tensor, fp32, bw)


def _scaled(launch: Launch, section: str, name: str, table: dict[str, float] | None = None) -> float | None:
    """A metric in base units (bytes, seconds): ncu scales units (Kbyte, usecond...)."""
    value = launch.value(section, name)
    if value is None:
        return None
    unit = launch.metrics[(section, name)][1].strip()
    if table is not None:
        return value * table[unit] if unit in table else None
    m = re.fullmatch(r"([KMGT]?)(?:byte|B)(/s(?:econd)?)?", unit)
    return value * _PREFIX[m.group(1)] if m else (value if unit in ("", "inst") else None)


def point(launch: Launch, cc: str) -> Point:
    """One launch's figures; `NcuError` names the section or metrics the export lacks."""
    seconds = _scaled(launch, SOL, "Duration", _TIME)
    if not seconds:
        raise NcuError(f"launch {launch.id} ({launch.kernel}): no Duration; capture with --section SpeedOfLight")
    sources = ["Duration"]
    read, write = (_scaled(launch, RAW_SECTION, m) for m in DRAM_BYTES)
    if read is not None and write is not None:
        dram, sources = read + write, [*sources, *DRAM_BYTES]
    elif (rate := _scaled(launch, MEMORY, "Memory Throughput")) is not None:
        dram, sources = rate * seconds, [*sources, "Memory Throughput (dram__bytes.sum.per_second)"]
    else:
        raise NcuError(f"launch {launch.id} ({launch.kernel}): no DRAM bytes; capture with --section "
                       f"MemoryWorkloadAnalysis or --metrics {','.join(DRAM_BYTES)}")
    flops = 0.0
    pipe, active = launch.value(RAW_SECTION, TENSOR_PIPE), launch.value(SOL, "SM Active Cycles")
    sms = launch.value(LAUNCH, "# SMs")
    if pipe is not None and active and sms and (per_cycle := sm_tensor_flops(cc)):
        flops += pipe / 100 * active * sms * per_cycle
        sources += [TENSOR_PIPE, "SM Active Cycles", "# SMs"]
    for metric, per_inst in CORE_OPS.items():
        if (count := launch.value(RAW_SECTION, metric)) is not None:
            flops += per_inst * count
            sources.append(metric)
    if len(sources) == 2:
        raise NcuError(f"launch {launch.id} ({launch.kernel}): no FLOP counters; capture with --section "
                       f"SpeedOfLight --section LaunchStats --metrics {METRICS}")
    return Point(launch.id, launch.kernel, seconds, flops, dram, sources)


def compute_capabilities(path: str | Path) -> dict[str, str]:
    """Launch id -> compute capability ("9.0"), from the export's CC column."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if len(r) > 10]
    head = {name: i for i, name in enumerate(rows[0])} if rows else {}
    if "CC" not in head:
        return {}
    return {r[head["ID"]]: r[head["CC"]] for r in rows[1:]}


def points(launches: list[Launch], ccs: dict[str, str]) -> list[Point]:
    """Points of every launch; `ccs` maps a launch id to its compute capability."""
    return [point(x, ccs.get(x.id, "")) for x in launches]


def roofline_markdown(pts: list[Point], r: Roofs, source: str) -> str:
    ridge_t, ridge_f = r.ridge(r.tensor_tflops), r.ridge(r.fp32_tflops)
    rows = []
    for p in pts:
        roof = r.roof(p.intensity, r.tensor_tflops)
        bound = "memory" if p.intensity < ridge_t else "compute"
        rows.append([f"#{p.id}", p.kernel[:60], f"{p.seconds * 1e6:.1f}", f"{p.flops / 1e9:.2f}",
                     f"{p.dram_bytes / 1e6:.1f}", f"{p.intensity:.1f}", f"{p.flops_per_s / 1e12:.1f}",
                     f"{p.flops_per_s / roof:.0%}", bound])
    used = sorted({s for p in pts for s in p.sources})
    return "\n".join([
        f"# Roofline of `{source}` on {r.gpu}", "",
        f"Roofs: {r.tensor_tflops:g} TFLOP/s dense bf16/f16 tensor, {r.fp32_tflops:g} TFLOP/s fp32, "
        f"{r.dram_tbps:g} TB/s DRAM; ridge points {ridge_t:.0f} FLOP/B (tensor) and {ridge_f:.1f} FLOP/B (fp32).",
        "", f"Metrics used: {', '.join(used)}.", "",
        *markdown_table(["launch", "kernel", "us", "GFLOP", "DRAM MB", "FLOP/B", "TFLOP/s",
                         "of the tensor roof", "side of the ridge"], rows), ""])


def plot(pts: list[Point], r: Roofs, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    xs = [10 ** (i / 20) for i in range(-20, 81)]  # 0.1 .. 10^4 FLOP/B
    for tflops, label in ((r.tensor_tflops, "bf16/f16 tensor"), (r.fp32_tflops, "fp32")):
        ax.plot(xs, [r.roof(x, tflops) / 1e12 for x in xs], label=f"{label} {tflops:g} TFLOP/s")
        ax.axvline(r.ridge(tflops), color="0.8", lw=0.8, ls=":")
    for p in pts:
        ax.scatter(p.intensity, p.flops_per_s / 1e12, zorder=3)
        ax.annotate(f"#{p.id} {p.kernel[:28]}", (p.intensity, p.flops_per_s / 1e12), fontsize=7,
                    textcoords="offset points", xytext=(4, 4))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"roofline on {r.gpu} ({r.dram_tbps:g} TB/s DRAM)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
