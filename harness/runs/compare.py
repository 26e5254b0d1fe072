"""Run the same training step in eager PyTorch, compiled PyTorch and JAX, check they
agree, report side by side (the library behind `python -m harness.compare`).

Each backend runs `harness.run` in its own subprocess (JAX preallocates most of the GPU,
and an out-of-memory in one backend must not poison the other), then `harness.parity`
compares each with eager torch on the same weights and batch. The processes share
persistent compile caches (JAX's, Inductor's and Triton's; temporary ones unless
--compile-cache names a folder), so parity reuses the runs' executables and GEMM autotuning.
Ratios are against the first backend. Results go to <out>/<model>-ctx<N>-<dtype>[-<attention>]-<gpu>/:
summary.json, report.md, phases.png; an existing folder of that name is replaced only with
--overwrite (a folder that appears meanwhile is kept and the new one written beside it).
Ctrl-C or SIGTERM keeps what finished: the finished backends' documents and a partial summary go to
<name>-interrupted/, and `Interrupted` says what is there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

from harness import child_process, held_signals, stopped_by
from harness.backends import get as backend_record
from harness.common.documents import COMPARE_SCHEMA, Status, run_records
from harness.common.results import environment, gpu_slug, nvidia_smi
from harness.reports.compare_folder import keep_documents, write_results
from harness.runs.compare_profiles import backend_timeline, communication_overlap, keep_profiles, kernel_breakdown
from harness.runs.distributed import rank_path
from harness.timing.spec import PHASE_ORDER, Comparison, compile_cache_env, run_argv
from harness.trace.analyses.ranks import KernelBreakdown


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during a comparison; the message says what finished and where it was kept."""


class NotRendered(Exception):
    """The runs finished but their reports could not be written; the message says why and
    where the documents were kept."""


def _stream(cmd: list[str], env: dict) -> tuple[int, str]:
    """Run `cmd`, passing its stderr (progress) through; return exit code and stderr's tail.
    An interrupt stops the subprocess too before it is re-raised."""
    tail = []
    with child_process(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env) as proc:
        for line in proc.stderr:
            sys.stderr.write(line)
            tail = (tail + [line.rstrip()])[-20:]
        return proc.wait(), "\n".join(tail)


def subprocess_env(compile_cache: str, **extra: str) -> dict[str, str]:
    """The environment of the run and parity subprocesses: the shared compile caches
    (`compile_cache_env`), so the parity process reuses the timed runs' compilations
    instead of repeating them."""
    return dict(os.environ, **compile_cache_env(compile_cache), **extra)


def run_backend(backend: str, comparison: Comparison, workdir: str) -> tuple[dict, str | None]:
    """harness.run for one backend in a subprocess, under nsys or a framework profiler if
    asked; returns its result document and the profile it left (or None)."""
    out = os.path.join(workdir, f"{backend}.json")
    spec, record, c = comparison.run_spec(backend), backend_record(backend), comparison
    profile = None
    ranks = spec.data_parallel > 1 and not record.one_process  # a process per device: a profile each
    if c.profiler == "framework":
        spec = dataclasses.replace(spec, framework_profile=os.path.join(workdir,
                                                                        record.profile_file.format(name=backend)))
        profile = rank_path(spec.framework_profile, 0) if ranks else spec.framework_profile
    program = run_argv(spec, out)
    if c.profiler == "nsys" and ranks:
        stem = os.path.join(workdir, backend)
        program += ["--nsys-ranks", stem, *(["--nsys-bin", c.nsys_bin] if c.nsys_bin else [])]
        profile = rank_path(stem, 0) + ".nsys-rep"
    elif c.profiler == "nsys":
        from harness.trace.sources.nsys import profile_command

        stem = os.path.join(workdir, f"{backend}")
        program, profile = profile_command(stem, program, c.nsys_bin, record.nsys_flags), stem + ".nsys-rep"
    start = time.perf_counter()
    code, tail = _stream(program, subprocess_env(c.compile_cache))
    print(f"[{backend}] finished in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    if os.path.exists(out):
        with open(out) as f:
            doc = json.load(f)
        if command := (doc.get("env") or {}).get("command"):  # the work folder goes with the run: its files by name
            doc["env"]["command"] = command.replace(workdir.rstrip(os.sep) + os.sep, "")
        return doc, profile if profile and os.path.exists(profile) else None
    if code == 0 and c.profiler == "nsys" and not ranks:  # harness.run exits 0 only after writing `out`
        message = (f"--nsys-bin {program[0]} exited with code 0 without running harness.run, so it did not "
                   "profile; name the Nsight Systems binary (nsys) or drop --nsys-bin")
    else:
        message = f"harness.run exited with code {code} and no result; last output:\n{tail.strip() or '(none)'}"
    return {"status": Status.ERROR.value, "error": {"phase": "process", "message": message}}, None


def run_parity(comparison: Comparison, workdir: str, backends: list[str]) -> dict:
    """harness.parity of `backends` against eager torch in a subprocess, halving the batch
    until two models fit at once."""
    r = comparison.run
    batch = r.batch
    env = subprocess_env(comparison.compile_cache, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    while True:
        out = os.path.join(workdir, f"parity-b{batch}.json")
        cmd = [sys.executable, "-m", "harness.parity", "--model", r.model, "--ctx", str(r.ctx), "--batch", str(batch),
               "--dtype", r.dtype, "--attention", r.attention, "--device", r.device, "--seed", str(r.seed),
               "--out", out, "--backend", ",".join(backends)]
        start = time.perf_counter()
        code, tail = _stream(cmd, env)
        print(f"[parity] finished in {time.perf_counter() - start:.0f} s", file=sys.stderr)
        doc = None
        if os.path.exists(out):
            with open(out) as f:
                doc = json.load(f)
        if doc is not None and doc.get("status") == Status.OOM and batch > 1:
            print(f"[parity] out of memory at batch {batch}; retrying at batch {batch // 2}", file=sys.stderr)
            batch //= 2
            continue
        if doc is not None and "status" not in doc:
            doc["reduced_batch"] = batch != r.batch
            return doc
        if doc is not None:
            return {"ok": None, "error": doc["error"], "batch": batch}
        return {"ok": None, "error": tail.strip().splitlines()[-1] if tail.strip() else f"exit code {code}",
                "batch": batch}


def parity_or_skip(comparison: Comparison, runs: dict[str, dict], workdir: str, backends: list[str]) -> dict:
    """The parity check, or its skip when every backend ran out of memory: parity holds
    both models at once, so at the same size it would run out of memory too."""
    if all(r.status is Status.OOM for r in run_records(runs).values()):
        batch = comparison.run.batch
        reason = f"skipped: every backend ran out of memory at batch {batch}, so parity (both models at once) would too"
        print(f"[parity] {reason}", file=sys.stderr)
        return {"ok": None, "error": reason, "skipped": True, "batch": batch}
    return run_parity(comparison, workdir, backends)


def phase_table(runs: dict[str, dict]) -> list[dict]:
    """One row per phase: each backend's phase record and its median over the first
    backend's (`ratios`). In the `fused_step` row a backend without a fused step stands
    with its (only) step."""
    table = []
    typed = run_records(runs)
    phases = [p for p in PHASE_ORDER if any(p in r.phases for r in typed.values())]
    reference = next(iter(runs), None)
    for name in phases:
        row = {"phase": name}
        for backend, r in typed.items():
            own = "step" if name == "fused_step" and name not in r.phases else name
            row[backend] = r.phases.get(own) if r.ok else None
        ref = row.get(reference)
        row["ratios"] = {b: row[b]["median_ms"] / ref["median_ms"] if ref and row[b] else None
                         for b in runs if b != reference}
        table.append(row)
    return table


def summarize_compare(comparison: Comparison, runs: dict[str, dict], parity: dict | None) -> dict:
    """The compare document: the runs, the phase table (`phase_table`) and the parity verdict."""
    table, r = phase_table(runs), comparison.run
    reference = next(iter(runs), None)
    typed = run_records(runs)
    ok_runs = [r for r in typed.values() if r.ok]
    device = ok_runs[0]["env"].get("device") if ok_runs else None
    return {
        "schema": COMPARE_SCHEMA,
        "ok": len(ok_runs) == len(typed) and bool(parity and parity.get("ok")),
        "options": {k: getattr(r, k) for k in ("model", "ctx", "batch", "dtype", "attention", "mode", "device",
                                               "warmup", "steps", "seed", "optimizer")},
        "data_parallel": {"n": r.data_parallel, "parallel": r.parallel},
        "reference": reference,
        "device": device,
        "runs": runs,
        "table": table,
        "parity": parity,
        "env": environment(),
    }


def expected_device(device: str) -> str | None:
    """The device name the runs on `device` will report, known before they start: "cpu",
    else the GPU's name from nvidia-smi (None when it cannot tell)."""
    return "cpu" if device == "cpu" else nvidia_smi().get("gpu_name")


def result_dir_name(comparison: Comparison, device: str | None) -> str:
    """Folder name of a comparison. `device` is the device a successful run
    reported; when every run failed there is none, and the requested device
    names the folder (a failed GPU run is not filed as a CPU one)."""
    r = comparison.run
    attention = "" if r.attention == "naive" else f"-{r.attention}"
    profiled = "-profiled" if comparison.profiler else ""
    parallel = f"-{r.parallel}{r.data_parallel}" if r.data_parallel > 1 else ""
    if device is None:
        device = r.device
    slug = gpu_slug(device if device != "cpu" else None)
    return f"{r.model}-ctx{r.ctx}-{r.dtype}{attention}{parallel}-{slug}{profiled}"


def finished_runs(backends: list[str], workdir: str) -> dict[str, dict]:
    """The result documents that the backends' runs wrote (each atomically, once finished)."""
    docs = {}
    for backend in backends:
        path = os.path.join(workdir, f"{backend}.json")
        if os.path.exists(path):
            with open(path) as f:
                docs[backend] = json.load(f)
    return docs


def keep_interrupted(comparison: Comparison, backends: list[str], finished: dict[str, dict],
                     by: str = "Ctrl-C") -> str:
    """After Ctrl-C or SIGTERM (`by`): write the finished backends' documents and a partial
    summary (the others marked "interrupted") to <name>-interrupted/; returns what was kept and where."""
    if not finished:
        return "interrupted before any backend finished; nothing was written"
    stopped = {"status": Status.INTERRUPTED.value, "error": {"phase": "process", "message": f"stopped by {by}"}}
    runs = {b: finished.get(b, stopped) for b in backends}
    summary = summarize_compare(comparison, runs, None)
    summary["interrupted"] = True
    name = result_dir_name(comparison, summary["device"]) + "-interrupted"
    path = write_results(summary, comparison.out, name, overwrite=True, runs=finished)
    left = [b for b in backends if b not in finished]
    return (f"interrupted: {', '.join(finished)} finished, kept in {path} ({', '.join(f'{b}.json' for b in finished)}"
            f" and a partial summary.json); not finished: {', '.join(left) or 'parity'}")


def breakdown(c: Comparison, profiles: dict[str, str], runs: dict[str, dict], summary: dict,
              work: str) -> tuple[list, list] | None:
    """The kernel breakdown of the backends' `profiles` (their per-layer times join `runs`, the
    data-parallel overlap and any failure `summary`); the profiles copied to --keep-profiles."""
    from harness.trace.analyses.registry import jsonable
    from harness.trace.profile import ProfileError

    kernels = None
    try:
        kernels = kernel_breakdown(profiles, work, c.nsys_bin)
        for backend, bd in zip(profiles, kernels.breakdowns):
            if bd.layers:  # the per-layer time joins the run's document
                runs[backend]["layers"] = bd.layers
        summary["analyses"] = {backend: {name: jsonable(r) for name, r in got.items()}
                               for backend, got in kernels.analyses.items()}
        if c.run.data_parallel > 1:
            summary["overlap"] = communication_overlap(profiles, c.run.data_parallel, c.nsys_bin, runs)
    except ProfileError as exc:
        summary["kernel_breakdown_error"] = str(exc)
    if c.keep_profiles:
        keep_profiles(profiles, c.keep_profiles)
    return kernels


def write_or_keep(summary: dict, c: Comparison, kernels: KernelBreakdown | None) -> str:
    """The result folder written under --out, or kept in a temporary folder (said on stderr)
    when --out cannot take it; its path."""
    name = result_dir_name(c, summary["device"])
    try:
        return write_results(summary, c.out, name, kernels, overwrite=c.overwrite)
    except OSError as exc:  # --out was checked; it went away or filled up since: keep the result anyway
        path = write_results(summary, tempfile.mkdtemp(prefix="compare-kept-"), name, kernels)
        print(f"error: --out {c.out}: could not write the result folder ({exc.strerror or exc}); "
              f"it is kept in {path}", file=sys.stderr)
        return path
    except Exception as exc:  # noqa: BLE001  (a report that fails to render must not lose the runs)
        path = keep_documents(summary, c.out, f"{name}-unrendered", kernels)
        raise NotRendered(f"the runs finished, but their reports could not be written ({type(exc).__name__}: "
                          f"{exc}); the documents are kept in {path}; `--render {path}` writes the reports from "
                          "them") from exc


def compare(comparison: Comparison) -> tuple[dict, str]:
    """Run each backend, the parity check (skipped when every backend ran out of memory)
    and the kernel breakdown (when `comparison.profiler` is "nsys" or "framework"); write
    the result folder under `comparison.out` (replacing one of the same name if
    `overwrite`). Returns the compare document and the folder's path; Ctrl-C or SIGTERM
    raises `Interrupted` once what finished is kept."""
    backends = list(comparison.backends)
    with tempfile.TemporaryDirectory(prefix="compare-") as work:
        c = dataclasses.replace(comparison, compile_cache=os.path.abspath(comparison.compile_cache
                                                                          or os.path.join(work, "compile-cache")))
        results: dict[str, tuple[dict, str | None]] = {}
        try:
            for b in backends:
                results[b] = run_backend(b, c, work)
            runs = {b: doc for b, (doc, _) in results.items()}
            compared = [b for b in backends if not backend_record(b).reference]
            parity = None if c.no_parity or len(backends) < 2 else parity_or_skip(c, runs, work, compared)
        except KeyboardInterrupt as exc:
            raise Interrupted(keep_interrupted(c, backends, finished_runs(backends, work), stopped_by(exc))) from None
        ok = {b for b, r in run_records(runs).items() if r.ok}
        profiles = {b: prof for b, (_, prof) in results.items() if prof and b in ok}
        summary = summarize_compare(c, runs, parity)
        kernels, stopped = None, None
        try:
            if profiles:
                kernels = breakdown(c, profiles, runs, summary, work)
        except KeyboardInterrupt as exc:  # the runs and parity finished: written without the breakdown
            stopped = f"stopped by {stopped_by(exc)} during the kernel breakdown"
            summary["kernel_breakdown_error"] = stopped
            kernels = None
        step, path = "as the result folder was written (it was finished first)", None
        try:
            with held_signals():
                path = write_or_keep(summary, c, kernels)
            if kernels and c.timeline:
                from harness.trace.timeline import write_timeline

                step = "while timeline.json.gz was written (it may be incomplete)"
                write_timeline(os.path.join(path, "timeline.json.gz"),
                               backend_timeline(profiles, kernels.breakdowns, c.run.data_parallel, c.nsys_bin,
                                                c.timeline_steps))
        except KeyboardInterrupt as exc:
            stopped = stopped or f"stopped by {stopped_by(exc)} {step}"
    if stopped:
        raise Interrupted(f"interrupted: {stopped}; " + (f"the runs and parity are kept in {path}" if path else
                                                         "the result folder was not written"))
    return summary, path
