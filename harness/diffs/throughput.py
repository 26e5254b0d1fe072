"""GEMM TFLOP/s against the dtype's dense peak and the optimizer's GB/s against HBM, per
side of a diff: the FLOPs and bytes the harness counts for one device's --batch rows
over that device's kernel time (figures of the diff are per device). `mfu_points` splits
a profiled step's time into its MFU and the points each kind of work costs it."""

from __future__ import annotations

from dataclasses import dataclass

from harness.common.documents import whole_step
from harness.common.hardware import hbm_tbps, peak_tflops
from harness.config import ModelConfig, config_from_document
from harness.diffs.inputs import PhaseProfile, Run
from harness.timing.flops import optimizer_bytes, phase_flops
from harness.trace.kernels import Category


def doc_field(doc: dict | None, path: tuple[str, ...]) -> object:
    """`doc[path[0]][path[1]]...`, None where a level is missing."""
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


@dataclass
class Throughput:
    what: str  # "GEMM", "optimizer"
    unit: str  # "TFLOP/s", "GB/s"
    bound_name: str  # "bf16 dense peak", "HBM"
    a: float | None
    b: float | None
    a_bound: float | None
    b_bound: float | None


def _config(run: Run) -> ModelConfig | None:
    return config_problems(run)[0]


def config_problems(run: Run) -> tuple[ModelConfig | None, str | None]:
    """The model config a run's document saved, and what the diff must say about it: the
    saved fields this version does not know (read without them), or why there is none and
    so no GEMM or optimizer throughput (None: nothing to say)."""
    cfg = doc_field(run.doc, ("config",))
    if run.doc is None:
        return None, None  # a profile alone: the diff says it has no document
    if not isinstance(cfg, dict):
        return None, f"{run.label}: no GEMM or optimizer throughput: its document saved no model config"
    try:
        config, unknown = config_from_document(cfg)
    except (TypeError, ValueError) as exc:
        return None, f"{run.label}: no GEMM or optimizer throughput: its saved model config is not valid here ({exc})"
    if unknown:
        return config, (f"{run.label}: its saved model config has fields this version does not know "
                        f"({', '.join(unknown)}); read without them")
    return config, None


def gemm_flops(config: ModelConfig, batch: int, ctx: int, phase: str, fused_attention: bool) -> float:
    """Matmul FLOPs of `phase` run as GEMM kernels: all of them, less the attention products
    where fused-attention kernels ran them (`fused_attention`)."""
    total = phase_flops(config, batch, ctx).get(phase, 0)
    passes = total / phase_flops(config, batch, ctx)["forward"]
    attention = passes * config.num_layers * 4 * batch * ctx * ctx * config.d_model
    return total - attention if fused_attention else total


# The parts of `mfu_points`, in the order they are listed.
MFU_PARTS = ("MFU", "GEMMs below peak", "attention below peak", "other kernels", "GPU idle", "kernels overlapping")


def mfu_points(categories: dict[str, float], gpu_ns: float, busy_ns: float, range_ns: float, flops: float,
               flops_gemm: float, peak: float) -> dict[str, float]:
    """A profiled step's time as points of 100, by what it was spent on: the MFU (the step's
    FLOPs at the dense peak `peak` TFLOP/s), the GEMM kernels' time beyond their FLOPs
    (`flops_gemm`) at the peak, the attention kernels' beyond the rest of the FLOPs (the
    attention products a fused kernel ran), every other kernel's, memcpy's and memset's time
    (no counted FLOPs: elementwise work, norms, the optimizer, copies), the step's time with
    no kernel running, and less the time kernels ran at once (`busy_ns` under `gpu_ns`, the
    sum of their times). `categories`: kernel ns per category; all figures per step. The
    points sum to 100: the MFU plus what each part costs it."""
    at_peak = lambda f: f / (peak * 1e3)  # noqa: E731  ns at the peak (TFLOP/s = 1e3 FLOP/ns)
    gemm, attention = categories.get(Category.GEMM.value, 0.0), categories.get(Category.ATTENTION.value, 0.0)
    parts = (at_peak(flops), gemm - at_peak(flops_gemm), attention - at_peak(flops - flops_gemm),
             gpu_ns - gemm - attention, range_ns - busy_ns, busy_ns - gpu_ns)
    return {name: 100 * ns / range_ns for name, ns in zip(MFU_PARTS, parts)}


def profiled_mfu_points(entry: dict, run: dict) -> dict[str, object] | None:
    """`mfu_points` of one backend's profiled step: `entry` its kernel breakdown as kernels.json
    holds it, `run` the run document it profiled. {"phase": the step (JAX's fused step where it
    ran one), each part's points}; None where the run records no model, batch, context or
    device with a known dense peak, or the profile has no step or no busy time."""
    phases = entry.get("phases") or {}
    phase = whole_step(phases)
    p, options = phases.get(phase), run.get("options") or {}
    config = config_from_document(run["config"])[0] if isinstance(run.get("config"), dict) else None
    peak = peak_tflops((run.get("env") or {}).get("device"), options.get("dtype"))
    if not (p and "busy_ns_per_step" in p and config and options.get("batch") and options.get("ctx") and peak):
        return None
    batch, ctx, cats = options["batch"], options["ctx"], p["categories"]
    points = mfu_points(cats, p["gpu_ns_per_step"], p["busy_ns_per_step"], p["range_ns_per_step"],
                        phase_flops(config, batch, ctx)[phase],
                        gemm_flops(config, batch, ctx, phase, bool(cats.get(Category.ATTENTION.value))), peak)
    return {"phase": phase, **points}


def _gemm_flops(run: Run, phase: str, p: PhaseProfile) -> float | None:
    config, batch, ctx = _config(run), doc_field(run.doc, ("options", "batch")), doc_field(run.doc, ("options", "ctx"))
    if config is None or not batch or not ctx:
        return None
    return gemm_flops(config, batch, ctx, phase, bool(p.categories.get(Category.ATTENTION.value)))


def throughput(a: Run, b: Run, pair: tuple[str, str, str], pa: PhaseProfile, pb: PhaseProfile) -> list[Throughput]:
    out = []
    gemm, opt = {}, {}
    for side, run, phase, p in (("a", a, pair[1], pa), ("b", b, pair[2], pb)):
        ns = p.categories.get(Category.GEMM.value, 0.0)
        flops = _gemm_flops(run, phase, p)
        device, dtype = doc_field(run.doc, ("env", "device")), doc_field(run.doc, ("options", "dtype"))
        gemm[side] = (flops / ns / 1e3 if flops and ns else None, peak_tflops(device, dtype))
        config = _config(run)
        ons = p.categories.get(Category.OPTIMIZER.value, 0.0)
        opt[side] = (optimizer_bytes(config) / ons if config and ons and phase != "forward" else None,
                     (tbps * 1e3 if (tbps := hbm_tbps(device)) else None))
    dtype = doc_field(a.doc, ("options", "dtype")) or "?"
    if gemm["a"][0] or gemm["b"][0]:
        out.append(Throughput("GEMM", "TFLOP/s", f"{dtype} dense peak", gemm["a"][0], gemm["b"][0],
                              gemm["a"][1], gemm["b"][1]))
    if opt["a"][0] or opt["b"][0]:
        out.append(Throughput("optimizer", "GB/s", "HBM bandwidth", opt["a"][0], opt["b"][0], opt["a"][1], opt["b"][1]))
    return out


