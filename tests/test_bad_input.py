"""Bad input and interruption end in one line on stderr that names the option and the fix,
a non-zero exit code and no traceback, and lose no finished work. Each case runs the real
command (its `main(argv)`, or a subprocess where the exit path matters)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys

import pytest

from harness import bench_attention, compare, memory_model, run, sweep
from harness.common import results
from harness.config import PRESETS, get_config
from harness.sweeps.memory_model import predict
from harness.timing import compare as compare_lib
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
@pytest.mark.slow
def test_ctrl_c_during_compare_keeps_what_finished(tmp_path) -> None:
    out = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "harness.compare", "--ctx", "16", "--device", "cpu", "--backend", "torch,jax",
                             "--warmup", "0", "--steps", "1", "--out", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, umask=0o022)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("[torch] finished"):
            break
    os.kill(proc.pid, signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen) + rest
    last = rest.strip().splitlines()[-1]
    kept = out / "tiny-ctx16-fp32-cpu-interrupted"
    assert "Traceback" not in rest.split("[torch] finished")[-1]
    assert last.startswith("error: interrupted: torch finished") and str(kept) in last and "not finished: jax" in last
    summary = json.loads((kept / "summary.json").read_text())
    assert summary["interrupted"] and summary["runs"]["jax"]["status"] == "interrupted"
    torch_doc = json.loads((kept / "torch.json").read_text())
    assert torch_doc["status"] == "ok" and torch_doc == summary["runs"]["torch"]
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o755
    assert not (out / "tiny-ctx16-fp32-cpu").exists()
