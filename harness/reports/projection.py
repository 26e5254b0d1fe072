"""Data-parallel step time projected past the measured device counts, on paper.

From one backend's runs at N = 1 and at one N > 1 (the same per-device batch), the model
predicts the step at other N, on one node or several:

    step(N)      = compute + exposed(N) + other
    compute      = the N = 1 step (weak scaling: every device's work stays that of one)
    comm(N)      = ring all-reduce of the gradients: 2 (N - 1) / N x bytes / bus bandwidth
                   on one node; over k nodes of D devices, hierarchical: reduce-scatter and
                   all-gather inside the node, 2 (D - 1) / D x bytes / intra bus bandwidth,
                   plus an all-reduce of each device's 1/D share across nodes,
                   2 (k - 1) / k x bytes / D / inter-node bandwidth per device
    exposed(N)   = (1 - hidden) x comm(N)
    hidden       = 1 - (step(N_fit) - compute) / comm(N_fit), from the measured run at N_fit,
                   between 0 and 1
    other        = step(N_fit) - compute - comm(N_fit) where the fitted step grew by more than
                   its whole all-reduce (waiting for a straggler, the wrapper's bookkeeping),
                   else 0; kept at every N, so no projection undercuts the fitted run
    efficiency   = compute / step(N)

The bytes are the float32 gradients (4 x parameters; 2 x under `--grad-comm bf16`); the
bus bandwidth is the link the run measured (`data_parallel.link`, torch) or given. What
it leaves out: latency terms of the ring (small next to gigabyte all-reduces), bandwidth
that changes with N inside a node (an NVSwitch node gives every pair the same), and any
straggler or waiting beyond what the fitted run had (`other` keeps the fitted run's).
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.timing.scaling import step_figures

ASSUMPTIONS = ("weak scaling: per-device batch and compute fixed at the N = 1 step; ring all-reduce "
               "2(N-1)/N x bytes / bus bandwidth inside a node, hierarchical across nodes (intra-node "
               "reduce-scatter + all-gather, inter-node all-reduce of each device's 1/D share); the hidden share "
               "of communication fitted at the measured N and kept, and growth beyond the whole all-reduce kept "
               "as a fixed other term; ring latency and stragglers beyond the fitted run's not modelled")


def comm_ms(n: int, grad_bytes: float, busbw_gbps: float, per_node: int = 8,
            inter_gbps: float | None = None) -> float:
    """All-reduce time (ms) of `grad_bytes` over `n` devices (see the module docstring);
    `inter_gbps`: inter-node bandwidth per device in Gbit/s."""
    if n <= per_node:
        return 2 * (n - 1) / n * grad_bytes / (busbw_gbps * 1e9) * 1e3
    if inter_gbps is None:
        raise ValueError(f"N = {n} spans {n // per_node} nodes of {per_node}: give --inter-node-gbps")
    nodes = n / per_node
    intra = 2 * (per_node - 1) / per_node * grad_bytes / (busbw_gbps * 1e9)
    inter = 2 * (nodes - 1) / nodes * grad_bytes / per_node / (inter_gbps / 8 * 1e9)
    return (intra + inter) * 1e3


def project(base: dict, fit: dict, targets: Sequence[int], busbw_gbps: float | None = None, per_node: int = 8,
            inter_gbps: float | None = None, measured: Sequence[dict] = ()) -> dict:
    """The projection from `base` (an N = 1 result document) and `fit` (one at N > 1) to
    every N in `targets`, each with the `measured` document at that N beside it where one
    is given. Raises ValueError naming what is missing."""
    n1, _, compute, _, _ = step_figures(base)
    nf, _, fit_step, _, _ = step_figures(fit)
    if n1 != 1 or nf < 2:
        raise ValueError(f"the fit needs an N = 1 run and one at N > 1; got N = {n1} and N = {nf}")
    link = (fit.get("data_parallel") or {}).get("link") or {}
    busbw = busbw_gbps or link.get("busbw_gbps")
    if not busbw:
        raise ValueError("no link bandwidth: the N > 1 run measured none (JAX runs do not); give --busbw-gbps")
    grad_bytes = (2 if fit["options"].get("grad_comm") == "bf16" else 4) * fit["num_params"]
    fit_comm = comm_ms(nf, grad_bytes, busbw, per_node, inter_gbps)
    hidden = min(max(1 - (fit_step - compute) / fit_comm, 0.0), 1.0) if fit_comm else 1.0
    other = max(fit_step - compute - fit_comm, 0.0)
    by_n = {step_figures(d)[0]: d for d in measured}
    rows = []
    for n in targets:
        comm = comm_ms(n, grad_bytes, busbw, per_node, inter_gbps)
        exposed = (1 - hidden) * comm
        row = {"n": n, "nodes": -(-n // per_node), "comm_ms": comm, "exposed_ms": exposed,
               "step_ms": compute + exposed + other, "efficiency": compute / (compute + exposed + other),
               "measured_step_ms": None, "measured_efficiency": None}
        if n in by_n:
            row["measured_step_ms"] = step_figures(by_n[n])[2]
            row["measured_efficiency"] = compute / row["measured_step_ms"]
        rows.append(row)
    return {"backend": base["options"]["backend"], "compute_ms": compute, "fit_n": nf, "fit_step_ms": fit_step,
            "grad_bytes": grad_bytes, "busbw_gbps": busbw, "busbw_source": "given" if busbw_gbps else "measured link",
            "hidden": hidden, "other_ms": other, "per_node": per_node, "inter_gbps": inter_gbps, "rows": rows}


def format_projection(p: dict) -> str:
    """The projection as markdown: the fitted inputs, the formula, then one row per N."""
    from harness.common.tables import markdown_table

    body = [[r["n"], r["nodes"], f"{r['comm_ms']:.3f}", f"{r['exposed_ms']:.3f}", f"{r['step_ms']:.3f}",
             f"{100 * r['efficiency']:.1f}%",
             f"{r['measured_step_ms']:.3f}" if r["measured_step_ms"] else "-",
             f"{100 * r['measured_efficiency']:.1f}%" if r["measured_efficiency"] else "-"] for r in p["rows"]]
    inter = f"{p['inter_gbps']:g} Gbit/s per device" if p["inter_gbps"] else "not given"
    strategy = f" ({p['strategy']})" if p.get("strategy") else ""
    lines = [f"Projection for {p['backend']}{strategy}: compute {p['compute_ms']:.3f} ms (the N = 1 step); "
             f"fitted at N = {p['fit_n']} ({p['fit_step_ms']:.3f} ms): {100 * p['hidden']:.1f}% of the all-reduce "
             f"hidden, other {p['other_ms']:.3f} ms; gradients {p['grad_bytes'] / 1e9:.3f} GB; bus bandwidth "
             f"{p['busbw_gbps']:.1f} GB/s ({p['busbw_source']}); "
             f"{p['per_node']} devices per node; inter-node {inter}.", "",
             *markdown_table(["N", "nodes", "all-reduce ms", "exposed ms", "step ms", "efficiency",
                              "measured step ms", "measured efficiency"], body), "",
             "step(N) = compute + (1 - hidden) x comm(N) + other; comm(N) = 2(N-1)/N x bytes / bus bandwidth on "
             "one node, + 2(k-1)/k x bytes / D / inter-node bandwidth over k nodes of D devices; efficiency = "
             "compute / step(N).", f"Assumptions: {ASSUMPTIONS}."]
    return "\n".join(lines) + "\n"
