"""The attention tools speak the harness's dialect: `--backend` means a framework backend
everywhere, so their kernel family is `--kernel` (the old spelling hidden, with one warning);
each tool builds a frozen options record once and hands that record, not a Namespace, to
the library."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from test_layout import _parser

from harness import attention_once, attention_targets, bench_attention, ncu, ncu_source, tune_attention
from harness.attention.options import BenchOptions, OnceOptions, TuneOptions

TOOLS = ("bench_attention", "tune_attention", "attention_once", "attention_targets", "ncu", "ncu_source")
TINY = ["--device", "cpu", "--seq", "40", "--head-dim", "16", "--heads", "1", "--dtype", "fp32", "--causal", "true"]


@pytest.mark.parametrize("name", TOOLS)
def test_no_backend_option_means_something_else(name: str) -> None:
    """A visible --backend in an attention tool would name a kernel where every other tool names
    a registered framework backend; a hidden one may only be the old spelling of --kernel."""
    actions = {flag: a for a in _parser(name)._actions for flag in a.option_strings}
    backend = actions.get("--backend")
    if backend is not None:
        assert backend.help == argparse.SUPPRESS, f"{name}: a visible --backend"
        assert backend.dest == actions["--kernel"].dest == "kernel", f"{name}: --backend is not --kernel's old name"


@pytest.mark.parametrize("tool, argv", [(tune_attention, ["--passes", "fwd"]), (attention_once, [])],
                         ids=["tune_attention", "attention_once"])
def test_kernel_and_its_old_spelling(tool, argv, capsys) -> None:
    assert tool.parse_args(["--kernel", "triton", *argv]).kernel == "triton"
    assert capsys.readouterr().err == ""
    assert tool.parse_args(["--backend", "triton", *argv]).kernel == "triton"
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--backend is now --kernel" in err[0]
    with pytest.raises(SystemExit):
        tool.parse_args(["--kernel", "torch", *argv])
    assert "unknown kernel 'torch'" in capsys.readouterr().err


@pytest.mark.parametrize("tool, record", [(bench_attention, BenchOptions), (tune_attention, TuneOptions),
                                          (attention_once, OnceOptions)],
                         ids=["bench_attention", "tune_attention", "attention_once"])
def test_parse_args_gives_the_frozen_record(tool, record) -> None:
    options = tool.parse_args(["--device", "cpu"])
    assert type(options) is record
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.device = "cuda"


def test_bench_hands_its_record_to_the_library(tmp_path, monkeypatch, capsys) -> None:
    got = []

    def measure_cell(cell, impls, options):
        got.append(options)
        return []

    monkeypatch.setattr(bench_attention, "measure_cell", measure_cell)
    monkeypatch.setattr(bench_attention, "write_results", lambda rows, options: got.append(options) or {})
    assert bench_attention.main([*TINY, "--impl", "pallas", "--out", str(tmp_path)]) == 0
    assert len(got) == 2 and all(type(o) is BenchOptions for o in got)
    assert got[0].impl == ("pallas",) and got[0].seq == (40,) and got[0].cells() == [
        {"batch": 1, "heads": 1, "seq": 40, "head_dim": 16, "dtype": "float32", "causal": True}]


def test_tune_hands_its_record_to_the_library(tmp_path, monkeypatch, capsys) -> None:
    got = []
    monkeypatch.setattr(tune_attention, "run", lambda options, path: got.append(options) or [])
    argv = [*TINY, "--kernel", "triton", "--shapes", "grid", "--out", str(tmp_path)]
    assert tune_attention.main(argv) == 0
    (options,) = got
    assert type(options) is TuneOptions and (options.kernel, options.name) == ("triton", "triton-d16")
    assert (tmp_path / "triton-d16.jsonl").is_file()


def test_once_hands_its_record_to_the_library(monkeypatch, capsys) -> None:
    import jax.numpy as jnp

    got = []
    monkeypatch.setattr(attention_once, "run", lambda options: got.append(options) or (jnp.ones(2),) * 3)
    assert attention_once.main(["--device", "cpu", "--kernel", "triton", "--seq", "24", "--causal", "false"]) == 0
    (options,) = got
    assert type(options) is OnceOptions and (options.kernel, options.seq, options.causal) == ("triton", 24, False)
    assert "attention_once: triton bf16 1x24x16x64 causal=false ran 2x" in capsys.readouterr().out


def test_the_other_tools_refuse_in_one_line(tmp_path, capsys) -> None:
    """attention_targets, ncu and ncu_source: a bad value is one `error:` line naming the option."""
    with pytest.raises(SystemExit):
        attention_targets.main([str(tmp_path / "x.json"), "--targets", "turing"])
    with pytest.raises(SystemExit):
        ncu_source.main([str(tmp_path / "x.csv"), "--top", "0"])
    for err in capsys.readouterr().err.splitlines():
        assert err.startswith("error: argument --"), err
    assert ncu.main([str(tmp_path / "missing.csv")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
