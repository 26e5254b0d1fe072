"""What a run records about where and from which code it ran."""

from __future__ import annotations

import os
import re

from harness.common import results


def test_commit_comes_from_git_in_a_checkout(monkeypatch) -> None:
    monkeypatch.delenv("XFPROF_GIT_COMMIT", raising=False)
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", results.git_commit() or "")


def test_an_explicit_commit_wins_over_the_copy_s_git(monkeypatch) -> None:
    # A copied tree may carry a stale .git folder; the commit named by whoever copied it wins.
    monkeypatch.setenv("XFPROF_GIT_COMMIT", "0123abc")
    assert results.git_commit() == "0123abc"


def test_nvidia_smi_line_is_parsed_by_field() -> None:
    line = "NVIDIA H100 80GB HBM3, 580.159.04, 700.00 W, 1980 MHz\n" * 2
    assert results.parse_nvidia_smi(line) == {"gpu_name": "NVIDIA H100 80GB HBM3", "driver": "580.159.04",
                                               "gpu_power_limit": "700.00 W", "gpu_max_sm_clock": "1980 MHz"}
    # A field the driver cannot read is left out, not recorded as "[N/A]".
    assert "gpu_power_limit" not in results.parse_nvidia_smi("NVIDIA A10, 535.1, [N/A], 1695 MHz")
    assert results.parse_nvidia_smi("") == {}


def test_settings_made_through_the_environment_are_recorded(monkeypatch) -> None:
    for name in [k for k in os.environ if k.startswith(results.SETTINGS_PREFIXES)]:
        monkeypatch.delenv(name)
    assert "settings" not in results.environment()
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=false")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.94")
    monkeypatch.setenv("ENABLE_PERSISTENT_TMA_MATMUL", "1")
    monkeypatch.setenv("HOME_NOT_A_SETTING", "x")
    assert results.environment()["settings"] == {"ENABLE_PERSISTENT_TMA_MATMUL": "1",
                                                 "XLA_FLAGS": "--xla_gpu_enable_triton_gemm=false",
                                                 "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.94"}


def test_one_row_answers_every_question_about_a_gpu() -> None:
    """Peak, bandwidth, memory and the per-SM tensor rate of a device come from its one
    row; the order keeps the longer names first (L40S not L4, the 80 GB A100 not the 40 GB)."""
    from harness.common.hardware import gpu, hbm_tbps, memory_mib, peak_tflops, sm_tensor_flops

    a100 = "NVIDIA A100-SXM4-80GB"
    assert (peak_tflops(a100, "bf16"), hbm_tbps(a100), memory_mib(a100)) == (312.0, 2.0, 81920)
    assert gpu("NVIDIA A100-SXM4-40GB").memory_mib == 40960 and gpu("NVIDIA L40S").pattern == "L40S"
    assert sm_tensor_flops(gpu("NVIDIA H100 80GB HBM3").compute_capability) == 4096
    assert sm_tensor_flops("8.0") == 2048 and sm_tensor_flops("8.9") is None and gpu("Tesla T4") is None


def test_nvidia_smi_asks_for_the_visible_gpus(monkeypatch, tmp_path) -> None:
    """nvidia-smi lists every GPU whatever CUDA_VISIBLE_DEVICES says: it is asked for those by --id."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "$@" > "$0.args"\nprintf "NVIDIA H200, 580.1, 700 W, 1980 MHz, 143771 MiB\\n'
                   'NVIDIA H100, 580.1, 700 W, 1980 MHz, 81559 MiB\\n"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert [g["gpu_memory"] for g in results.nvidia_smi_all()] == ["143771 MiB", "81559 MiB"]
    assert (tmp_path / "nvidia-smi.args").read_text().split()[-1] == "--id=2,3"
    assert results.nvidia_smi()["gpu_name"] == "NVIDIA H200"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU visible: nvidia-smi is not asked
    assert results.nvidia_smi_all() == [] and results.nvidia_smi() == {}
