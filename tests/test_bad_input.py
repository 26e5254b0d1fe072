"""Bad input and interruption end in one line on stderr that names the option and the fix,
a non-zero exit code and no traceback, and lose no finished work. Each case runs the real
command (its `main(argv)`, or a subprocess where the exit path matters)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

import harness
from harness import bench_attention, compare, memory_model, parity, report, run, scaling, sweep
from harness.common import results
from harness.config import PRESETS, get_config
from harness.runs import compare as compare_lib
from harness.sweeps.step_memory import predict
from harness.timing.parity import check_parity
from harness.timing.spec import Comparison, RunSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _main(module, argv: list[str], capsys) -> tuple[int, str]:
    """Exit code and stderr of `module.main(argv)`, whether it returns or exits."""
    try:
        code = module.main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def _one_line(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and all(n in lines[0] for n in needles), err


def _python(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          **kwargs)


# -- numbers out of range name their option -----------------------------------------------
@pytest.mark.parametrize("module, argv, option", [
    (run, ["--backend", "torch", "--ctx", "16", "--steps", "0"], "--steps"),
    (sweep, ["--model", "tiny", "--ctx", "16,0"], "--ctx"),
    (memory_model, ["--ctx", "0"], "--ctx"),
    (compare, ["--ctx", "16", "--batch", "-2"], "--batch"),
])
def test_a_bad_number_names_its_option(module, argv, option, capsys, tmp_path) -> None:
    code, err = _main(module, [*argv, "--out", str(tmp_path / "out")] if module is not memory_model else argv, capsys)
    assert code == 2
    _one_line(err, f"argument {option}:", "expected a positive integer")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("steps", ["0", "-1"])
def test_parity_without_steps_is_refused(steps: str) -> None:
    done = _python("harness.parity", "--device", "cpu", "--steps", steps)
    assert done.returncode == 2 and "PASS" not in done.stdout
    _one_line(done.stderr, "argument --steps:", f"got '{steps}'")


def test_parity_library_refuses_zero_steps() -> None:
    with pytest.raises(ValueError, match="at least one AdamW step"):
        check_parity(get_config("tiny"), steps=0)


@pytest.mark.parametrize("option, value", [("--seq", "0"), ("--heads", "0"), ("--head-dim", "64,0"),
                                           ("--batch", "-1"), ("--warmup", "-1"), ("--iters", "0")])
def test_bench_attention_refuses_empty_sizes_before_writing(option: str, value: str, tmp_path, capsys) -> None:
    out = tmp_path / "bench"
    code, err = _main(bench_attention, ["--device", "cpu", option, value, "--out", str(out)], capsys)
    assert code == 2 and not out.exists()
    _one_line(err, f"argument {option}:", repr(value.split(",")[-1]))


# -- output paths, checked before anything runs ---------------------------------------------
def test_sweep_out_naming_a_file(tmp_path, capsys) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    code, err = _main(sweep, ["--model", "tiny", "--ctx", "16", "--device", "cpu", "--out", str(target)], capsys)
    assert code == 2 and target.read_text() == "keep me"
    _one_line(err, "--out", "is a file", "name a folder")


@pytest.mark.parametrize("below_a_file", [False, True])
def test_compare_out_naming_a_file_is_refused_before_running(below_a_file: bool, tmp_path, capsys) -> None:
    target = tmp_path / "results"
    target.write_text("keep me")
    out = target / "sub" if below_a_file else target
    code, err = _main(compare, ["--ctx", "16", "--device", "cpu", "--out", str(out)], capsys)
    assert code == 2 and target.read_text() == "keep me"
    _one_line(err, "--out", "is a file")
    assert "[torch]" not in err  # no backend started


def test_compare_into_an_existing_result_folder_is_refused(tmp_path, capsys) -> None:
    existing = tmp_path / "tiny-ctx16-fp32-cpu"
    existing.mkdir()
    (existing / "summary.json").write_text("{}")
    code, err = _main(compare, ["--ctx", "16", "--device", "cpu", "--out", str(tmp_path)], capsys)
    assert code == 2 and (existing / "summary.json").read_text() == "{}"
    _one_line(err, str(existing), "--overwrite", "another --out")
    assert "--overwrite" in compare.build_parser().format_help()


def test_run_out_naming_a_folder_is_refused_and_leaves_nothing(tmp_path, capsys) -> None:
    code, err = _main(run, ["--backend", "torch", "--ctx", "16", "--device", "cpu", "--steps", "1",
                            "--out", str(tmp_path)], capsys)
    assert code == 2 and os.listdir(tmp_path) == []
    _one_line(err, "--out", "is a folder", "name a file in it")


def test_a_failed_atomic_write_leaves_no_temporary_file(tmp_path) -> None:
    (tmp_path / "result.json").mkdir()  # os.replace onto a folder fails
    with pytest.raises(OSError):
        results.write_json(tmp_path / "result.json", {"a": 1})
    assert os.listdir(tmp_path) == ["result.json"]
    with pytest.raises(TypeError):  # a document that is not JSON fails half-way through the dump
        results.write_json(tmp_path / "other.json", {"a": object()})
    assert os.listdir(tmp_path) == ["result.json"]


def test_a_write_cut_short_keeps_the_document_that_was_there(tmp_path) -> None:
    """A report being written again that fails (or is stopped) half-way leaves the old one whole."""
    report = tmp_path / "report.md"
    report.write_text("# the report as it was\n")
    with pytest.raises(KeyboardInterrupt), results.atomic_path(report) as tmp, open(tmp, "w") as f:
        f.write("# half a ne")
        raise KeyboardInterrupt
    assert report.read_text() == "# the report as it was\n" and os.listdir(tmp_path) == ["report.md"]
    results.write_text(report, "# the new report\n")
    assert report.read_text() == "# the new report\n" and os.listdir(tmp_path) == ["report.md"]
    link = tmp_path / "latest.md"
    link.symlink_to(report)  # a link (or /dev/stdout) is written through, not replaced by a file
    results.write_text(link, "# through the link\n")
    assert link.is_symlink() and report.read_text() == "# through the link\n"


def test_result_folders_get_the_usual_permissions(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        folder = results.make_dir_tmp(".x.", tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o755


# -- memory model without arguments -------------------------------------------------------
def test_memory_model_without_arguments_prints_the_fit_table(capsys) -> None:
    assert memory_model.main([]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert set(PRESETS) <= set(rows)
    large_1024 = predict(get_config("large"), 4, 1024, "fp32")["peaks"]["step"] / 2**30
    assert rows["large"].split("|")[-2].strip() == f"{large_1024:.3g}"


# -- parity after out-of-memory -------------------------------------------------------------
def test_parity_is_skipped_when_every_backend_ran_out_of_memory(tmp_path, capsys, monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(compare_lib, "run_parity", lambda args, work, backends: calls.append(1) or {"ok": True})
    args = Comparison(run=RunSpec(backend="torch", model="tiny", ctx=16, batch=8), backends=("torch", "jax"))
    doc = compare_lib.parity_or_skip(args, {"torch": {"status": "oom"}, "jax": {"status": "oom"}}, str(tmp_path), ["jax"])
    assert calls == [] and doc["ok"] is None and doc["skipped"]
    assert "every backend ran out of memory at batch 8" in capsys.readouterr().err
    assert compare_lib.parity_or_skip(args, {"torch": {"status": "ok"}, "jax": {"status": "oom"}},
                                      str(tmp_path), ["jax"]) == {"ok": True}
    assert calls == [1]


# -- Ctrl-C during compare ---------------------------------------------------------------
def _default_sigint() -> None:
    """In the child: Ctrl-C's default disposition, so Python installs its handler even where
    the tests run as a background job, whose SIGINT the shell set to ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _children(pid: int) -> list[int]:
    """The live child processes of `pid`."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(child) for child in f.read().split()]


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("sig, by", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_a_signal_during_compare_keeps_what_finished(tmp_path, sig, by) -> None:
    """Ctrl-C, or SIGTERM to compare alone (what `timeout` or a scheduler sends): the finished
    backend is kept and announced, the running one stopped, the work folder removed."""
    out, tmp = tmp_path / "results", tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "harness.compare", "--ctx", "16", "--device", "cpu", "--backend", "torch,jax",
                             "--warmup", "0", "--steps", "1", "--out", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, umask=0o022,
                            preexec_fn=_default_sigint, env=dict(os.environ, TMPDIR=str(tmp)))
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("[torch] finished"):
            break
    deadline = time.monotonic() + 30
    while not (children := _children(proc.pid)) and time.monotonic() < deadline:  # jax's run starting
        time.sleep(0.02)
    os.kill(proc.pid, sig)
    _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen) + rest
    deadline = time.monotonic() + 10  # a loaded machine may still be tearing a stopped child down
    while any(_running(child) for child in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert children and not any(_running(child) for child in children)
    assert os.listdir(tmp) == []  # the work folder (with torch.json) removed once kept
    last = rest.strip().splitlines()[-1]
    kept = out / "tiny-ctx16-fp32-cpu-interrupted"
    assert "Traceback" not in rest.split("[torch] finished")[-1]
    assert last.startswith("error: interrupted: torch finished") and str(kept) in last and "not finished: jax" in last
    summary = json.loads((kept / "summary.json").read_text())
    assert summary["interrupted"] and summary["runs"]["jax"]["status"] == "interrupted"
    assert summary["runs"]["jax"]["error"]["message"] == f"stopped by {by}"
    torch_doc = json.loads((kept / "torch.json").read_text())
    assert torch_doc["status"] == "ok" and torch_doc == summary["runs"]["torch"]
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o755
    assert not (out / "tiny-ctx16-fp32-cpu").exists()


# -- output paths: a real write, before any work; a finished result is never lost ----------
@pytest.mark.parametrize("module, argv", [
    (run, ["--backend", "torch", "--ctx", "16", "--steps", "1"]),
    (parity, ["--ctx", "16", "--steps", "1"]),
])
def test_an_out_nothing_can_be_written_in_is_refused_before_running(module, argv, capsys) -> None:
    """/proc takes no new files, for root too (whose permission bits say it may)."""
    code, err = _main(module, [*argv, "--device", "cpu", "--out", "/proc/x.json"], capsys)
    assert code == 2
    _one_line(err, "--out /proc/x.json:", "cannot write in /proc", "name a folder you can write to")
    assert "PASS" not in capsys.readouterr().out


def test_parity_out_naming_a_folder_is_refused_before_running(tmp_path, capsys) -> None:
    code, err = _main(parity, ["--device", "cpu", "--steps", "1", "--out", str(tmp_path)], capsys)
    assert code == 2 and os.listdir(tmp_path) == []
    _one_line(err, "--out", "is a folder", "name a file in it")


@pytest.mark.parametrize("module", [run, parity])
def test_an_existing_out_file_is_kept_without_overwrite(module, tmp_path, capsys) -> None:
    target = tmp_path / "result.json"
    target.write_text("keep me")
    argv = ["--device", "cpu", "--ctx", "16", "--steps", "1", "--out", str(target)]
    code, err = _main(module, [*argv, "--backend", "torch"] if module is run else argv, capsys)
    assert code == 2 and target.read_text() == "keep me"
    _one_line(err, f"--out {target}: already exists", "--overwrite")


def test_a_result_that_cannot_be_written_at_the_end_is_kept(tmp_path) -> None:
    """The folder went away after the check: the document lands in the temporary folder."""
    line = results.save_json("/proc/gone/result.json", {"status": "ok", "step": 1.5})
    kept = line.rsplit(" ", 1)[-1]
    assert line.startswith("--out /proc/gone/result.json: could not write it") and kept.endswith(".json")
    try:
        assert json.loads(open(kept).read()) == {"status": "ok", "step": 1.5}
    finally:
        os.remove(kept)
    assert results.save_json(tmp_path / "r.json", {"a": 1}) is None and json.loads((tmp_path / "r.json").read_text())


@pytest.mark.parametrize("module, argv", [
    (run, ["--backend", "torch", "--ctx", "16"]),
    (compare, ["--ctx", "16"]),
])
def test_compile_cache_naming_a_file_is_refused(module, argv, tmp_path, capsys) -> None:
    cache = tmp_path / "cache"
    cache.write_text("not a folder")
    code, err = _main(module, [*argv, "--device", "cpu", "--compile-cache", str(cache),
                               "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and cache.read_text() == "not a folder"
    _one_line(err, f"--compile-cache {cache}: is a file", "name a folder")


# -- options that cannot apply, or cannot be honoured here --------------------------------
@pytest.mark.parametrize("module, extra, named", [
    (compare, ["--model", "large"], "--model"),
    (compare, ["--ctx", "64", "--backend", "jax"], "--ctx, --backend"),
    (sweep, ["--ctx", "16"], "--ctx"),
])
def test_render_refuses_options_it_cannot_use(module, extra, named, tmp_path, capsys) -> None:
    code, err = _main(module, ["--render", str(tmp_path), *extra], capsys)
    assert code == 2
    _one_line(err, f"--render {tmp_path} runs nothing, so {named} cannot apply", "drop")


@pytest.mark.parametrize("option, value", [("--backend", "jax,torch,jax"), ("--ctx", "16,32,16")])
def test_a_list_with_a_repeated_value_is_refused(option, value, tmp_path, capsys) -> None:
    code, err = _main(sweep, ["--model", "tiny", "--ctx", "16", "--device", "cpu", option, value,
                              "--out", str(tmp_path / "sweep")], capsys)
    assert code == 2 and not (tmp_path / "sweep").exists()
    repeated = value.split(",")[0]
    _one_line(err, f"argument {option}:", f"{repeated} is listed twice", "list each value once")


def test_more_torch_ranks_than_cores_is_refused_up_front(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    code, err = _main(run, ["--backend", "torch", "--ctx", "16", "--device", "cpu", "--data-parallel", "64",
                            "--out", str(tmp_path / "r.json")], capsys)
    assert code == 2 and not (tmp_path / "r.json").exists()
    _one_line(err, "--data-parallel 64:", "2 core(s)", "use --data-parallel 2 or fewer")


def test_annotate_attention_leaves_out_the_default_backends_that_cannot_hold_it(capsys) -> None:
    """The README's `compare --model tiny --ctx 64 --profile --annotate-attention` runs torch
    and jax and says torch-compile was left out; asked for by name, torch-compile is refused."""
    args = compare.build_parser().parse_args(["--ctx", "64", "--annotate-attention"])
    assert compare.default_backends(args) == ["torch", "jax"]
    _one_line(capsys.readouterr().err, "compare: skipping torch-compile: --annotate-attention")
    code, err = _main(compare, ["--ctx", "64", "--device", "cpu", "--annotate-attention",
                                "--backend", "torch,torch-compile"], capsys)
    assert code == 2
    _one_line(err, "--annotate-attention with --backend torch-compile", "use --backend torch or jax")


@pytest.mark.parametrize("fake", ["/bin/true", "/bin/false"])
def test_compare_refuses_an_nsys_bin_that_is_not_nsys(fake, tmp_path, capsys) -> None:
    code, err = _main(compare, ["--ctx", "16", "--device", "cpu", "--nsys", "--nsys-bin", fake,
                                "--out", str(tmp_path)], capsys)
    assert code == 2 and os.listdir(tmp_path) == []
    _one_line(err, f"--nsys-bin {fake}:", "does not name NVIDIA Nsight Systems", "name the nsys binary")


def test_a_profiler_that_exits_without_running_the_step_is_named(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(compare_lib, "_stream", lambda program, env: (0, ""))
    args = compare.build_parser().parse_args(["--ctx", "8", "--device", "cpu", "--nsys-bin", "/bin/true"])
    args.compile_cache = str(tmp_path / "cache")
    doc, _ = compare_lib.run_backend("torch", compare.comparison_from_args(args, ["torch"], "nsys"), str(tmp_path))
    message = doc["error"]["message"]
    assert message.startswith("--nsys-bin /bin/true exited with code 0 without running harness.run") and "\n" not in message


# -- memory_model ----------------------------------------------------------------------------
def test_memory_model_answers_whether_one_size_fits(capsys) -> None:
    peak = max(predict(get_config("large"), 4, 1024, "fp32")["peaks"].values()) / 2**30
    assert memory_model.main(["--model", "large", "--ctx", "1024", "--device-memory-gb", "80"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"fits in 80 GiB: largest peak {peak:.3f} GiB (backward)"
    assert memory_model.main(["--model", "large", "--ctx", "1024", "--device-memory-gb", "16"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("does not fit in 16 GiB")


@pytest.mark.parametrize("argv, needles", [
    (["--model", "large", "--ctx", "100000000", "--batch", "100000"], ("--ctx 100000000 --batch 100000:",
                                                                        "beyond any device", "lower --ctx")),
    (["--ctx", "1024", "--device-memory-gb", "1e30"], ("argument --device-memory-gb:", "at most 10000", "'1e30'")),
    (["--ctx", "1024", "--device-memory-gb", "0"], ("argument --device-memory-gb:", "above 0")),
])
def test_memory_model_refuses_sizes_no_device_has(argv, needles, capsys) -> None:
    code, err = _main(memory_model, argv, capsys)
    assert code == 2 and capsys.readouterr().out == ""
    _one_line(err, *needles)


# -- profiles and run documents that are not what they claim ---------------------------------
DATA = os.path.join(ROOT, "tests", "data")
TORCH_ATTN = os.path.join(DATA, "torch_tiny_attn", "torch_tiny_attn.sqlite.gz")


def test_a_truncated_sqlite_export_is_one_line(tmp_path, capsys) -> None:
    with gzip.open(TORCH_ATTN) as f:
        raw = f.read()
    cut = tmp_path / "torch.sqlite"
    cut.write_bytes(raw[: len(raw) // 2])
    code, err = _main(report, [str(cut), "--out", str(tmp_path / "rep"), "--no-plot"], capsys)
    assert code == 2
    _one_line(err, f"{cut}: the SQLite file is damaged", "export it again")


@pytest.mark.parametrize("content", [b"", gzip.compress(b"")], ids=["empty file", "empty gzip"])
def test_an_empty_sqlite_gz_is_named_as_given(content, tmp_path, capsys) -> None:
    empty = tmp_path / "torch.sqlite.gz"
    empty.write_bytes(content)
    code, err = _main(report, [str(empty), "--out", str(tmp_path / "rep"), "--no-plot"], capsys)
    assert code == 2
    _one_line(err, f"{empty}: empty once unpacked")


@pytest.mark.parametrize("harness_json, needle", [
    ("jax_tiny_train/jax_tiny_train.harness.json", "the document is of backend jax, the profile of torch"),
    ("layers/torch_tiny_layers_plain.harness.json", "ran on NVIDIA H100 80GB HBM3, the profile on NVIDIA H200"),
])
def test_report_refuses_the_run_document_of_another_run(harness_json, needle, tmp_path, capsys) -> None:
    code, err = _main(report, [TORCH_ATTN, "--harness-json", os.path.join(DATA, harness_json),
                               "--out", str(tmp_path / "rep"), "--no-plot"], capsys)
    assert code == 2 and not (tmp_path / "rep").exists()
    _one_line(err, "--harness-json", needle, "pass the document harness.run wrote in the profiled run")


def test_report_labels_a_profile_by_the_longest_registered_backend_in_its_name(tmp_path, capsys, monkeypatch) -> None:
    """`torch-compile.sqlite.gz` is torch-compile's profile, not torch's, so torch-compile's
    run document is its own and no mismatch; a backend registered at run time
    (`torch-compile-x`) labels its files too, and a name holding two backends labels neither."""
    import dataclasses

    from harness import backends
    from harness.trace.profile import label_from_path

    profile = tmp_path / "torch-compile.sqlite.gz"
    profile.write_bytes(open(TORCH_ATTN, "rb").read())
    doc = json.loads(open(TORCH_ATTN.replace(".sqlite.gz", ".harness.json")).read())
    doc["options"]["backend"] = "torch-compile"
    (tmp_path / "torch-compile.json").write_text(json.dumps(doc))
    code, err = _main(report, [str(profile), "--harness-json", str(tmp_path / "torch-compile.json"),
                               "--out", str(tmp_path / "rep"), "--no-plot"], capsys)
    assert code == 0, err
    assert "torch-compile" in (tmp_path / "rep" / "kernels.md").read_text()
    monkeypatch.delenv(backends.PLUGINS_ENV, raising=False)
    backends.register(dataclasses.replace(backends.get("torch-compile"), name="torch-compile-x"))
    try:
        assert label_from_path("runs/torch-compile-x-trace.json") == "torch-compile-x"
        assert label_from_path("torch-compile-cg.nsys-rep") == "torch-compile-cg"
        assert label_from_path("jax-vs-torch.json.gz") == "jax-vs-torch"
    finally:
        backends.unregister("torch-compile-x")


def test_report_warns_where_the_run_document_s_forward_is_far_from_the_profile_s(tmp_path, capsys) -> None:
    """The `small` run's document beside the `tiny` profile: same backend, steps and GPU,
    but a forward 3.5x the profile's."""
    small = os.path.join(DATA, "torch_small_train", "torch_small_train.harness.json")
    code, err = _main(report, [TORCH_ATTN, "--harness-json", small, "--out", str(tmp_path / "rep"), "--no-plot"],
                      capsys)
    assert code == 0
    _one_line(err, "warning: --harness-json", "model small) is 3.49x the profile's (5.968 ms)")
    assert "model small) is 3.49x" in (tmp_path / "rep" / "kernels.md").read_text()


def test_report_refuses_negative_durations_naming_them(tmp_path, capsys) -> None:
    """A torch.profiler trace with every tenth GPU activity's duration negated: one line
    naming the records that end before they start, not a table of negative GPU time."""
    trace = json.loads(gzip.decompress(open(os.path.join(DATA, "user_profiles", "torch_profiler", "rank0.json.gz"),
                                            "rb").read()))
    gpu = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy",
                                                                                     "gpu_memset")]
    for e in gpu[::10]:
        e["dur"] = -e["dur"]
    path = tmp_path / "damaged.json.gz"
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))
    code, err = _main(report, [str(path), "--out", str(tmp_path / "rep"), "--no-plot"], capsys)
    assert code == 2 and not (tmp_path / "rep").exists()
    _one_line(err, f"{path}: {len(gpu[::10])} of {len(gpu)} GPU activities end before they start (negative "
                   "durations", "record the profile again")


COMPARE = os.path.join(ROOT, "results", "main-job", "large-ctx256-bf16-h200-profiled")


@pytest.mark.parametrize("given, needle", [
    (COMPARE, f"{COMPARE}: a harness.compare result folder, not a profile"),
    (os.path.join(COMPARE, "summary.json"), f"{COMPARE}: a harness.compare result folder, not a profile"),
    (os.path.join(COMPARE, "kernels.json"), "kernels.json: a kernel breakdown (kernels.json of harness.report"),
    (os.path.join(DATA, "torch_tiny_attn", "torch_tiny_attn.harness.json"),
     "torch_tiny_attn.harness.json: a harness.run result document, not a profile"),
], ids=["compare folder", "compare summary", "kernels.json", "run document"])
def test_report_of_a_result_of_the_harness_says_what_it_is(given, needle, tmp_path, capsys) -> None:
    code, err = _main(report, [given, "--out", str(tmp_path / "rep"), "--no-plot"], capsys)
    assert code == 2
    _one_line(err, needle)
    assert "traceEvents" not in err


def test_scaling_reads_a_compare_summary_as_its_runs(tmp_path, capsys) -> None:
    """The committed one-device compare whose JAX run ran out of memory: its summary (or its
    folder) stands for its runs, the finished ones tabulated with their own step medians;
    one whose runs all failed is named as such."""
    folder = os.path.join(ROOT, "results", "ctx1024", "large-ctx1024-bf16-fused-h100-80gb-hbm3")
    summary = json.loads(open(os.path.join(folder, "summary.json")).read())
    for given in (folder, os.path.join(folder, "summary.json")):
        assert scaling.main([given]) == 0
        out = capsys.readouterr().out
        for backend in ("torch", "torch-compile"):
            assert f"| {backend} | large ctx 1024 batch 4/device bf16 fused cuda | - | 1 | step | " \
                   f"{summary['runs'][backend]['phases']['step']['median_ms']:.3f} |" in out
        assert "| jax |" not in out
    failed = tmp_path / "summary.json"
    failed.write_text(json.dumps({**summary, "runs": {"jax": summary["runs"]["jax"]}}))
    code, err = _main(scaling, [str(failed)], capsys)
    assert code == 2
    _one_line(err, f"none of {failed} finished (status ok)")


# -- harness.scaling names the file ---------------------------------------------------------
@pytest.mark.parametrize("kind, needle", [("binary", "not JSON"), ("folder", "is a folder"),
                                          ("other JSON", "not a harness.run result document")])
def test_scaling_names_the_file_that_is_not_a_run_document(kind, needle, tmp_path, capsys) -> None:
    path = tmp_path / "n2.json"
    if kind == "binary":
        path.write_bytes(gzip.compress(b"\xff\xfe" * 100))
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_text(json.dumps({"status": "ok", "phases": {}}))
    code, err = _main(scaling, [str(path)], capsys)
    assert code == 2
    _one_line(err, f"error: {path}: {needle}", "give harness.run --out files")


# -- Ctrl-C while a tool is still importing --------------------------------------------------
@pytest.mark.parametrize("sig", harness.STOP_SIGNALS)
def test_a_stop_signal_is_ctrl_c_once_a_tool_has_started(sig) -> None:
    """SIGTERM and SIGHUP raise KeyboardInterrupt naming themselves, once (a repeat, as from a
    parent forwarding its group's signal, must not cut the keeping of finished work short)."""
    before = signal.getsignal(signal.SIGINT), {s: signal.getsignal(s) for s in harness.STOP_SIGNALS}
    try:
        for s in harness.STOP_SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        harness.starting()
        harness.started()
        with pytest.raises(KeyboardInterrupt) as stopped:
            os.kill(os.getpid(), sig)
            time.sleep(5)
        assert harness.stopped_by(stopped.value) == signal.Signals(sig).name
        assert signal.getsignal(sig) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before[0])
        for s, handler in before[1].items():
            signal.signal(s, handler)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_compare_starts_is_one_line(tmp_path, sig) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "harness.compare", "--ctx", "16", "--device", "cpu",
                             "--out", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_default_sigint)
    maps = f"/proc/{proc.pid}/maps"
    deadline = time.monotonic() + 60
    while "libtorch" not in open(maps).read() and time.monotonic() < deadline:  # torch is loading
        time.sleep(0.02)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and os.listdir(tmp_path) == []
    assert err in ("error: interrupted while starting; nothing ran\n",  # still importing, as a rule
                   "error: interrupted before any backend started; nothing was written\n")  # a fast machine


@pytest.mark.parametrize("layout", [["notes/deep/jax.xplane.pb.gz"],
                                    ["plugins/profile/a/h.xplane.pb.gz", "plugins/profile/b/h.xplane.pb.gz"]],
                         ids=["a trace far below", "two traces"])
def test_report_on_a_folder_that_is_not_one_jax_trace_is_refused(layout, tmp_path, capsys) -> None:
    """Only the folder jax.profiler.start_trace wrote, holding one trace, stands for its trace."""
    fixture = os.path.join(DATA, "jax_fallback", "jax_tiny_fallback.xplane.pb.gz")
    for relative in layout:
        (tmp_path / relative).parent.mkdir(parents=True)
        (tmp_path / relative).write_bytes(open(fixture, "rb").read())
    code, err = _main(report, [str(tmp_path), "--out", str(tmp_path / "rep"), "--no-plot"], capsys)
    assert code == 2 and not (tmp_path / "rep").exists()
    _one_line(err, f"{tmp_path}:", "JAX trace", "name the")


# -- a backend plugin that cannot be loaded ------------------------------------------------
@pytest.mark.parametrize("entry, needle", [
    ("no_such_module_xyz:RECORDS", "No module named 'no_such_module_xyz'"),
    ("harness.config:NO_SUCH_NAME", "has no attribute 'NO_SUCH_NAME'"),
    ("missing_plugin_file.py:RECORDS", "no file missing_plugin_file.py"),
    ("harness.config:ATTENTION_CHOICES", "names a tuple, not a Backend record"),
    ("no-colon", "is not <module or file.py>:<attribute>"),
])
def test_a_bad_backend_plugin_is_one_line_before_any_work(entry: str, needle: str, tmp_path) -> None:
    """The registry loads its plugins before the first lookup, in building --backend's
    choices: a bad entry ends the tool there, naming the variable, the entry and the fix."""
    out = tmp_path / "run.json"
    proc = _python("harness.run", "--backend", "torch", "--model", "tiny", "--ctx", "16", "--device", "cpu",
                   "--out", str(out), env={**os.environ, "HARNESS_BACKEND_PLUGINS": f"{entry}", "PYTHONPATH": ROOT})
    assert proc.returncode == 2
    _one_line(proc.stderr, f"HARNESS_BACKEND_PLUGINS entry {entry!r}", needle, "fix or remove that entry")
    assert not out.exists()
