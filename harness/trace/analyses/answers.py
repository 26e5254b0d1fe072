"""The report's questions (a)-(e), answered from a `Breakdown`, and what the harness's own
result JSON adds to them (its forward time, the attention shape)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.backends import names as backend_names
from harness.trace.kernels import Category
from harness.trace.profile import ATTENTION_RANGES, STEP_RANGES, Profile, ProfileError
from harness.trace.stats import Breakdown, PhaseStats

NOTABLE_SHARE = 0.05  # answer (c): non-GEMM kernels at or above this share of forward


def step_phase(bd: Breakdown) -> PhaseStats | None:
    """The step range's phase, else (a user's `train_step`) the root that holds the others."""
    found = next((bd.phases[s] for s in STEP_RANGES if s in bd.phases), None)
    roots = [p for p in bd.phases.values() if p.root == p.phase and len(bd.phases) > 1]
    return found or (roots[0] if len(roots) == 1 else None)


def _per_range(p: PhaseStats) -> float:
    """How many ranges of the phase's name run per step (e.g. one per layer)."""
    return p.occurrences / p.steps if p.steps else 0.0


def attention_flops(batch: int, seq: int, heads: int, d_head: int) -> dict[str, int]:
    """FLOPs of one naive attention call: QK^T and PV are each 2*B*H*T^2*Dh (the full
    T x T matrix, as the naive path computes it even when causal); the softmax is taken
    as 5 FLOPs per score (max, subtract, exp, sum, divide): 5*B*H*T^2."""
    scores = 2 * batch * heads * seq * seq * d_head
    return {"attn_scores": scores, "attn_softmax": 5 * batch * heads * seq * seq, "attn_values": scores}


def answers(bd: Breakdown, harness_forward_ms: float | None = None,
            metadata: dict | None = None) -> dict[str, dict | list | None]:
    """The report's questions (a)-(e), computed from `bd`; an entry is None when the
    profile lacks what it needs (e.g. no ``forward`` range).

    `harness_forward_ms`: the harness's own forward time per step, if known.
    `metadata`: ``batch``, ``seq``, ``heads``, ``d_head`` for the attention FLOPs of (e).
    """
    fwd, step = bd.phases.get("forward"), step_phase(bd)
    out: dict[str, dict | list | str | None] = dict.fromkeys("abcde")
    if fwd:
        # medians over the steps on both sides (the harness timer's figure is its median too)
        ref = harness_forward_ms if harness_forward_ms is not None else fwd.range_ns_median / 1e6
        gpu = fwd.gpu_ns_median / 1e6
        out["a"] = {"kernel_ms": gpu, "range_ms": fwd.range_ns_median / 1e6, "steps": fwd.steps,
                    "reference": "harness timer" if harness_forward_ms is not None else "NVTX range",
                    "reference_ms": ref, "difference_ms": ref - gpu,
                    "difference_pct": (ref - gpu) / ref * 100 if ref else None}
        top = fwd.kernels[0]
        step_top = step.kernels[0] if step else None
        out["b"] = {"name": top.name, "category": top.category, "share": top.share,
                    "ms_per_forward": top.ns_per_step / _per_range(fwd) / 1e6,
                    "calls_per_forward": top.calls_per_step / _per_range(fwd),
                    "top_in_step": step_top.name == top.name if step_top else None,
                    "step_top": step_top.name if step_top else None,
                    "step_top_share": step_top.share if step_top else None}
        out["c"] = [{"name": k.name, "category": k.category, "share": k.share}
                    for k in fwd.kernels
                    if k.category != Category.GEMM.value and k.share >= NOTABLE_SHARE]
        if step:
            cats = sorted(set(fwd.categories) | set(step.categories))
            growth = [{"category": c,
                       "forward_share": fwd.categories.get(c, 0.0) / fwd.gpu_ns_per_step,
                       "step_share": step.categories.get(c, 0.0) / step.gpu_ns_per_step,
                       "forward_ms": fwd.categories.get(c, 0.0) / 1e6,
                       "step_ms": step.categories.get(c, 0.0) / 1e6} for c in cats]
            out["d"] = {"gemm_forward_share": fwd.share(Category.GEMM),
                        "gemm_step_share": step.share(Category.GEMM),
                        "step": step.phase,
                        "growth": sorted(growth, key=lambda g: g["forward_share"] - g["step_share"])}
    attn = {n: bd.phases[n] for n in ATTENTION_RANGES if n in bd.phases}
    if len(attn) == len(ATTENTION_RANGES):
        ms = {n: p.gpu_ns_per_step / 1e6 for n, p in attn.items()}
        matmuls = ms["attn_scores"] + ms["attn_values"]
        e: dict = {"ms_per_step": ms, "softmax_to_matmuls_time": ms["attn_softmax"] / matmuls if matmuls else None}
        keys = ("batch", "seq", "heads", "d_head")
        if metadata and all(k in metadata for k in keys):
            flops = attention_flops(*(int(metadata[k]) for k in keys))
            e["flops_per_call"] = flops
            e["softmax_to_matmuls_flops"] = flops["attn_softmax"] / (flops["attn_scores"] + flops["attn_values"])
            e["tflops"] = {n: flops[n] * _per_range(p) / p.gpu_ns_per_step / 1e3 if p.gpu_ns_per_step else None
                           for n, p in attn.items()}
        out["e"] = e
    else:
        lacking = ", ".join(f"`{n}`" for n in ATTENTION_RANGES if n not in attn)
        out["e_missing"] = (f"no {lacking} range in this profile (attention inside one kernel or one jit has "
                            "none); profile the harness with `--annotate-attention --attention naive`")
    return out


def harness_metadata(path: str | Path) -> dict:
    """From a `harness.run` result JSON: its forward time (median ms over measured steps,
    compared with the breakdown's median) and the attention shape for answer (e)."""
    try:
        doc = json.loads(Path(path).read_text())
        opts, cfg = doc["options"], doc["config"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ProfileError(f"{path}: not a harness.run result JSON ({exc!r}); pass the file "
                           "written by `python -m harness.run --out`") from None
    forward = (doc.get("phases") or {}).get("forward") or {}
    return {"forward_ms": forward.get("median_ms", forward.get("mean_ms")), "batch": opts["batch"], "seq": opts["ctx"],
            "heads": cfg["num_heads"], "d_head": cfg["d_model"] // cfg["num_heads"], "path": str(path),
            "backend": opts.get("backend"), "steps": opts.get("steps"), "model": opts.get("model"),
            "gpu_name": (doc.get("env") or {}).get("gpu_name")}


# The harness's forward time and the profile's may differ by the profiler's overhead, not by
# this factor: beyond it the two come from different models, sizes or GPUs.
FORWARD_MISMATCH = 3.0


def run_json_problems(profile: Profile, bd: Breakdown, meta: dict) -> list[str]:
    """Whether the `harness.run` document `meta` (from `harness_metadata`) belongs to
    `profile` (whose breakdown is `bd`): a ProfileError where it cannot (another backend,
    another number of measured steps, another GPU), and a list of warnings where its
    forward time is far from the profile's (another model or size, likely)."""
    where = f"--harness-json {meta['path']} with {bd.path}"
    fix = "pass the document harness.run wrote in the profiled run"
    if bd.label in backend_names() and meta["backend"] and meta["backend"] != bd.label:
        raise ProfileError(f"{where}: the document is of backend {meta['backend']}, the profile of {bd.label}; {fix}")
    steps = sum(r.name == "step" for r in profile.ranges)
    if steps and meta["steps"] and steps != meta["steps"]:
        raise ProfileError(f"{where}: the document ran {meta['steps']} measured steps, the profile holds {steps}; "
                           f"{fix}")
    one_gpu = profile.gpu if profile.gpu and " + " not in profile.gpu else None  # several: no one name to match
    if one_gpu and meta["gpu_name"] and one_gpu != meta["gpu_name"]:
        raise ProfileError(f"{where}: the document ran on {meta['gpu_name']}, the profile on {one_gpu}; {fix}")
    fwd = bd.phases.get("forward")
    if not (fwd and fwd.range_ns_median and meta["forward_ms"]):
        return []
    ratio = meta["forward_ms"] / (fwd.range_ns_median / 1e6)
    if max(ratio, 1 / ratio) <= FORWARD_MISMATCH:
        return []
    return [f"{where}: the document's forward ({meta['forward_ms']:.3f} ms, model {meta['model']}) is {ratio:.3g}x "
            f"the profile's ({fwd.range_ns_median / 1e6:.3f} ms); if they are not the same run, answer (a) is wrong"]


