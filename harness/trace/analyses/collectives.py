"""Communication split into transfer and waiting, by aligning each collective across ranks.

A collective kernel (NCCL's `ncclDevKernel_*`, XLA's all-reduce and the like) starts when
its own rank reaches it and cannot finish before the last rank has reached it, so its
duration on an early rank is waiting for the others plus the transfer itself. The k-th
collective of one kind (all-reduce, all-gather, ...) on each rank is the same operation:
the ranks of a data-parallel job issue the same collectives in the same order. On every
rank, the part of the k-th collective before the last rank's k-th collective starts is
waiting, the rest transfer. This needs one clock for all ranks: nsys gives every process
of one host the same one, a JAX process's devices share its clock, and the harness's own
host timings (`time.perf_counter`, CLOCK_MONOTONIC on Linux) are one clock per host.

The rank that arrived last is named per collective; the phase that made it late is the
harness phase (`forward`, `backward`, `optimizer`) in which the last rank spent more time
than the others' median, from its step's start up to the collective's start. Where each
rank has its own profile, the share of that phase during which the late rank's GPU ran any
kernel says what made it slow: a phase whose GPU sits idle most of the time is paced by
the host issuing its kernels (launch-bound), not by the GPU's work.

Bandwidth per kind, where the bytes a step moves are known (the gradients' size the
harness counts): algorithm bandwidth = bytes / transfer time, and NCCL's bus bandwidth =
algorithm bandwidth x 2(N-1)/N for an all-reduce, x (N-1)/N for an all-gather or a
reduce-scatter, which makes it comparable with the link's peak whatever N.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from harness.trace.analyses.intervals import _categories, _measured, covered_measure, union
from harness.trace.kernels import Category
from harness.trace.profile import KERNEL, PHASES, STEP_RANGES, WARMUP, KernelTable, Profile, Range

if TYPE_CHECKING:
    from harness.trace.analyses.selection import Selection

# Collective kinds: (name, pattern in a kernel name), first match wins.
KINDS = (("all-reduce", re.compile(r"all_?-?reduce", re.IGNORECASE)),
         ("reduce-scatter", re.compile(r"reduce_?-?scatter", re.IGNORECASE)),
         ("all-gather", re.compile(r"all_?-?gather", re.IGNORECASE)),
         ("all-to-all", re.compile(r"all_?-?to_?-?all", re.IGNORECASE)),
         ("broadcast", re.compile(r"broadcast", re.IGNORECASE)),
         ("send/recv", re.compile(r"send|recv", re.IGNORECASE)))


def kind_of(name: str) -> str:
    """The collective kind of a communication kernel's name ("other" where none matches)."""
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "other")


def bus_factor(kind: str, n: int) -> float:
    """NCCL's bus-bandwidth factor: what a link carries per byte of the operation's size."""
    if kind == "all-reduce":
        return 2 * (n - 1) / n
    if kind in ("all-gather", "reduce-scatter"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class Op:
    """One collective on one rank: its kind and interval (ns, the clock shared by all ranks)."""

    kind: str
    start: int
    end: int


def kernel_ops(kt: KernelTable, ranges: Sequence[Range] = (), device: int | None = None,
               selected: Selection | None = None) -> list[Op]:
    """The communication kernels of the measured steps (of one `device` where given), in
    start order: those executing inside the step `ranges`, or those `selected` counts
    (`harness.trace.analyses.selection.select`: a user's program that does not synchronize
    runs a step's collectives after its range has ended)."""
    cats = _categories(kt)
    steps = selected.kernels["measured"] if selected is not None else _measured(kt, ranges)
    keep = steps & (kt.kind == KERNEL) & (cats == list(Category).index(Category.COMMUNICATION))
    if device is not None:
        keep &= kt.device == device
    return [Op(kind_of(kt.name_of(i)), int(kt.start[i]), int(kt.end[i])) for i in np.flatnonzero(keep)]


def range_ops(ranges: Sequence[Range], phase: str = "backward", kind: str = "all-reduce") -> list[Op]:
    """The `phase` ranges of the measured steps as collectives: for host timings without
    kernels, where the phase holds the collective (DDP's gradient all-reduce inside the
    backward) and waiting shows as the phase starting before the last rank's."""
    return [Op(kind, r.start, r.end) for r in ranges if r.name == phase]


def _elapsed(ranges: Sequence[Range], t: int) -> dict[str, float]:
    """Per harness phase, ns spent in it from the start of the step holding `t` up to `t`;
    "step start" is the step's start itself (a rank that began the step late)."""
    step = next((r for r in ranges if r.name in STEP_RANGES and r.start <= t <= r.end), None)
    if step is None:
        return {}
    out = {p: float(sum(max(0, min(r.end, t) - max(r.start, step.start)) for r in ranges
                        if r.name == p and step.start <= r.start < t)) for p in PHASES}
    out["step start"] = float(step.start)
    return out


def align(ops: Mapping[int, Sequence[Op]], ranges: Mapping[int, Sequence[Range]] | None = None,
          bytes_per_step: Mapping[str, float] | None = None, steps: int = 1) -> dict:
    """Transfer and waiting of every rank's collectives (`ops`: rank -> its collectives in
    start order), the rank that arrived last, the phase that made it late (from `ranges`,
    rank -> its harness ranges, where given; `late_ms`: how much longer the last rank had
    spent in it, mean over the collectives) and, with `bytes_per_step` (kind -> bytes one
    step's collectives of that kind move), bandwidth per kind; times in ms over all
    `steps` measured steps and per step."""
    ranks = sorted(ops)
    n = len(ranks)
    by_kind = {r: defaultdict(list) for r in ranks}
    for r in ranks:
        for op in ops[r]:
            by_kind[r][op.kind].append(op)
    kinds = sorted({k for r in ranks for k in by_kind[r]})
    totals = {r: {"communication": 0.0, "waiting": 0.0, "transfer": 0.0, "last": 0} for r in ranks}
    per_kind = {k: {"count": 0, "transfer": 0.0, "waiting": 0.0} for k in kinds}
    culprits: dict[str, float] = defaultdict(float)
    late_count, notes = 0, []
    for kind in kinds:
        counts = [len(by_kind[r][kind]) for r in ranks]
        if len(set(counts)) > 1:
            notes.append(f"{kind}: {', '.join(f'rank {r} {c}' for r, c in zip(ranks, counts))} collectives; "
                         f"the first {min(counts)} of each were aligned")
        for k in range(min(counts)):
            group = {r: by_kind[r][kind][k] for r in ranks}
            last = max(ranks, key=lambda r: group[r].start)
            arrival = group[last].start
            totals[last]["last"] += 1
            per_kind[kind]["count"] += 1
            for r, op in group.items():
                duration = op.end - op.start
                waiting = min(max(arrival - op.start, 0), duration)
                totals[r]["communication"] += duration
                totals[r]["waiting"] += waiting
                totals[r]["transfer"] += duration - waiting
                per_kind[kind]["transfer"] += (duration - waiting) / n
                per_kind[kind]["waiting"] += waiting / n
            if ranges and n > 1 and arrival > min(op.start for op in group.values()):
                late = _elapsed(ranges[last], arrival)
                others = [_elapsed(ranges[r], group[r].start) for r in ranks if r != last]
                late_count += 1
                for phase, ns in late.items():
                    culprits[phase] += ns - statistics.median(o.get(phase, ns) for o in others)
    ms = lambda ns: ns / 1e6  # noqa: E731
    steps = max(steps, 1)
    rank_rows = [{"rank": r, **{f"{key}_ms": ms(totals[r][key]) for key in ("communication", "waiting", "transfer")},
                  **{f"{key}_ms_per_step": ms(totals[r][key]) / steps for key in ("communication", "waiting",
                                                                                  "transfer")},
                  "last_count": totals[r]["last"]} for r in ranks]
    kind_rows = [{"kind": kind, "count": v["count"], "transfer_ms_per_step": ms(v["transfer"]) / steps,
                  "waiting_ms_per_step": ms(v["waiting"]) / steps} for kind, v in per_kind.items()]
    aligned = sum(v["count"] for v in per_kind.values())
    last = max(rank_rows, key=lambda x: x["last_count"]) if aligned else None
    phase = max(culprits, key=culprits.__getitem__) if culprits and max(culprits.values()) > 0 else None
    return with_sizes({"n": n, "steps": steps, "collectives": aligned, "ranks": rank_rows, "kinds": kind_rows,
                       "last_rank": last["rank"] if last and n > 1 else None,
                       "last_share": last["last_count"] / aligned if last and n > 1 else None,
                       "late_phase": phase, "late_ms": ms(culprits[phase]) / late_count if phase else None,
                       "notes": notes}, bytes_per_step or {})


def _steps(ranges: Sequence[Range]) -> int:
    """Measured steps: the disjoint spans of the step ranges."""
    steps = [r for r in ranges if r.name in STEP_RANGES]
    return len(union(np.array([r.start for r in steps]), np.array([r.end for r in steps]))[0]) if steps else 1


LAUNCH_BOUND = 0.5  # below this GPU-busy share of a phase, the host's launches set its pace


def phase_busy(profile: Profile, phase: str, ranges: Sequence[Range] | None = None) -> float | None:
    """Share of the measured `phase` ranges of `profile` (those outside warm-up ranges, or
    those among `ranges`) during which a kernel runs on its GPU: the union of its kernels'
    intervals over every stream, within the ranges, over the ranges' time. None without
    such ranges."""
    ranges = profile.ranges if ranges is None else ranges
    warm = [r for r in ranges if r.name == WARMUP]
    spans = [r for r in ranges if r.name == phase
             and not any(w.start <= r.start and r.end <= w.end for w in warm)]
    if not spans:
        return None
    phase_union = union(np.array([r.start for r in spans]), np.array([r.end for r in spans]))
    total = int(np.sum(phase_union[1] - phase_union[0]))
    kt = profile.kernels
    return covered_measure(union(kt.start, kt.end), phase_union) / total if total else None


def profile_split(profiles: Mapping[int, Profile], bytes_per_step: Mapping[str, float] | None = None,
                  selections: Mapping[int, Selection] | None = None) -> dict | None:
    """`align` over a data-parallel run's profiles: one per torch rank, each shifted onto
    the host's clock by its session start (an nsys report counts from its own), or JAX's
    one profile read as one timeline per device (its ranges shared by all). None where
    fewer than two timelines hold collectives. With a profile per rank, `late_busy` is the
    GPU-busy share of the late rank's late phase (`phase_busy`; None for one process).
    `selections` (per rank, `harness.trace.analyses.selection.select`) gives the kernels
    and ranges of the measured steps as the breakdown counts them, for users' profiles;
    without them, the kernels executing inside the step ranges count."""
    own = {r: (selections[r].measured_steps() if selections else p.ranges) for r, p in profiles.items()}
    pick = {r: selections[r] if selections else None for r in profiles}
    if len(profiles) == 1:
        ((rank, p),) = profiles.items()
        devices = np.unique(p.kernels.device).tolist()
        ops = {int(d): kernel_ops(p.kernels, own[rank], device=d, selected=pick[rank]) for d in devices}
        ranges = {int(d): own[rank] for d in devices}
        steps = _steps(own[rank])
    else:
        return ranks_split({r: rank_collectives(p, pick[r]) for r, p in profiles.items()}, bytes_per_step)
    if sum(1 for o in ops.values() if o) < 2:
        return None
    split = align(ops, ranges, bytes_per_step, steps)
    late = split["late_phase"] in PHASES and len(profiles) > 1 and split["last_rank"] in profiles
    last = split["last_rank"]
    split["late_busy"] = phase_busy(profiles[last], split["late_phase"], own[last]) if late else None
    return split


def rank_collectives(profile: Profile, selection: Selection | None = None) -> dict:
    """What `ranks_split` needs of one rank, and no more (a rank set's profiles are read one
    at a time): its collectives (`kernel_ops`), its step and phase ranges, its session
    start, and the GPU-busy share of each phase (`phase_busy`)."""
    own = selection.measured_steps() if selection else profile.ranges
    return {"ops": kernel_ops(profile.kernels, own, selected=selection),
            "ranges": [r for r in own if r.name in STEP_RANGES or r.name in PHASES],
            "start_ns": profile.session_start_ns,
            "busy": {p: phase_busy(profile, p, own) for p in PHASES}}


def ranks_split(ranks: Mapping[int, dict], bytes_per_step: Mapping[str, float] | None = None) -> dict | None:
    """`profile_split` of a profile per rank, from each rank's `rank_collectives`."""
    starts = {r: c["start_ns"] for r, c in ranks.items()}
    known = None not in starts.values()
    shift = {r: starts[r] - min(starts.values()) if known else 0 for r in ranks}
    ops = {r: [Op(o.kind, o.start + shift[r], o.end + shift[r]) for o in c["ops"]] for r, c in ranks.items()}
    if sum(1 for o in ops.values() if o) < 2:
        return None
    ranges = {r: [Range(x.name, x.start + shift[r], x.end + shift[r], x.thread) for x in c["ranges"]]
              for r, c in ranks.items()}
    split = align(ops, ranges, bytes_per_step, _steps(ranks[min(ranks)]["ranges"]))
    late = split["late_phase"] in PHASES and split["last_rank"] in ranks
    split["late_busy"] = ranks[split["last_rank"]]["busy"][split["late_phase"]] if late else None
    return split


def collective_bytes(doc: dict | None, fsdp2: bool = False, bf16_sums: bool = False) -> dict[str, float]:
    """Bytes per step of each collective kind the harness knows of a run document: the
    gradients all-reduced (DDP, JAX replicated) or reduce-scattered (FSDP2, JAX sharded), in
    float32 or, under torch's `--grad-comm bf16`, in bf16; and, for torch's FSDP2 (`fsdp2`:
    the run's backend's record says so, `Backend.gathers_parameters`), the all-gathers of the
    float32 parameters (no mixed-precision policy), once in the forward and again in the
    backward unless `--fsdp-reshard-after-forward false` kept them; empty where unknown. XLA
    picks what its collectives move: its all-gathers have no known size, and under bf16 it
    sums each matmul weight's gradient across devices in that gradient's dtype, bf16 (its
    kernels say `_bf16`), beside float32 sums of the rest (`bf16_sums`:
    `Backend.bf16_gradient_sums`), so JAX's gradient collectives have a known size only in fp32."""
    if not doc or not doc.get("num_params"):
        return {}
    o = doc.get("options") or {}
    if bf16_sums and o.get("dtype") == "bf16":
        return {}
    parallel = o.get("parallel", "ddp")
    size = (2.0 if o.get("grad_comm") == "bf16" else 4.0) * doc["num_params"]
    if parallel in ("ddp", "zero1"):
        return {"all-reduce": size}
    out = {"reduce-scatter": size}
    if fsdp2:
        out["all-gather"] = 4.0 * doc["num_params"] * (2 if o.get("fsdp_reshard_after_forward", True) else 1)
    return out


def with_sizes(split: dict, sizes: Mapping[str, float]) -> dict:
    """`split` with each collective kind's bandwidth from `sizes` (kind -> bytes per step), or
    none where `sizes` has no size for it: a document's figures under today's rules."""
    n = split["n"]
    kinds = []
    for k in split["kinds"]:
        size, t = sizes.get(k["kind"]), k["transfer_ms_per_step"] * 1e6
        algbw = size / t if size and t else None  # bytes per ns = GB/s
        kinds.append({**k, "bytes_per_step": size if algbw else None, "algbw_gbps": algbw,
                      "busbw_gbps": algbw * bus_factor(k["kind"], n) if algbw else None})
    return {**split, "kinds": kinds}


def format_split(split: dict, link: dict | None = None) -> list[str]:
    """Lines: per rank communication, transfer and waiting per step; per kind bandwidth
    against the link measured in the run; who arrived last and why."""
    lines = [f"{'rank':>4} {'comm ms/step':>13} {'transfer ms':>12} {'waiting ms':>11}"]
    lines += [f"{r['rank']:>4} {r['communication_ms_per_step']:>13.3f} {r['transfer_ms_per_step']:>12.3f} "
              f"{r['waiting_ms_per_step']:>11.3f}" for r in split["ranks"]]
    for k in split["kinds"]:
        bw = (f", {k['bytes_per_step'] / 1e9:.3f} GB/step: algorithm {k['algbw_gbps']:.1f} GB/s, bus "
              f"{k['busbw_gbps']:.1f} GB/s" if k["algbw_gbps"] else "")
        if bw and link:
            bw += f" (the link measured {link['busbw_gbps']:.1f} GB/s bus)"
        lines.append(f"{k['kind']}: {k['count']} aligned, transfer {k['transfer_ms_per_step']:.3f} ms/step, waiting "
                     f"{k['waiting_ms_per_step']:.3f} ms/step (mean over ranks){bw}")
    if split["last_rank"] is not None:
        late = (f"; late from its {split['late_phase']} (+{split['late_ms']:.3f} ms against the others' median, "
                "mean over the collectives)" if split["late_phase"] else "")
        if (busy := split.get("late_busy")) is not None:
            late += (f"; its GPU ran kernels {100 * busy:.0f}% of that phase's time"
                     + (": the host issuing the kernels (launch-bound), not the GPU's work, set the pace"
                        if busy < LAUNCH_BOUND else ""))
        lines.append(f"last to arrive: rank {split['last_rank']} in {100 * split['last_share']:.0f}% of the "
                     f"collectives{late}")
    return lines + [f"note: {n}" for n in split["notes"]]
