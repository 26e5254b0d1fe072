"""Peak throughput per GPU and dtype, and the environment of a run."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile

# Dense (no sparsity) tensor-core peaks in TFLOP/s from NVIDIA's datasheets.
# fp32 = plain FP32 on CUDA cores (what torch uses with TF32 off), tf32 = TF32 tensor cores.
# Ordered: the first entry whose key is a substring of the device name wins.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("H100 PCIe", {"bf16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("H100 NVL", {"bf16": 835.5, "tf32": 417.5, "fp32": 59.8}),
    ("H100", {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM5
    ("A100", {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    ("L4", {"bf16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("A10", {"bf16": 125.0, "tf32": 62.5, "fp32": 31.2}),
)


def peak_tflops(device_name: str | None, dtype: str) -> float | None:
    """Datasheet peak for this device and dtype, or None when the device is not in the table."""
    if not device_name:
        return None
    for key, peaks in PEAK_TFLOPS:
        if key in device_name:
            return peaks.get(dtype)
    return None


def git_commit() -> str | None:
    """$XFPROF_GIT_COMMIT when set (for code run from a copy of the tree, whose .git
    folder, if any, need not match the code), else HEAD of the checkout with -dirty for
    uncommitted changes, else None."""
    if os.environ.get("XFPROF_GIT_COMMIT"):
        return os.environ["XFPROF_GIT_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def command_line() -> str:
    """How this process was started, with temporary paths reduced to their file names."""
    tmp = tempfile.gettempdir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

    def clean(arg: str) -> str:
        if arg.startswith(root):
            return arg[len(root):]  # a file of this project, relative to its root
        if arg.startswith(tmp) or arg.startswith(os.path.expanduser("~")):
            return os.path.basename(arg)
        return arg

    args = [clean(a) for a in sys.orig_argv[1:]]
    return " ".join(["python", *args])


# nvidia-smi fields recorded with every result. A GPU held at its power limit
# under sustained load clocks down (an H100 at 700 W ran 1560-1875 MHz instead of
# 1980), so the limit and the clock ceiling say whether two machines compare.
NVIDIA_SMI_FIELDS = {"name": "gpu_name", "driver_version": "driver", "power.limit": "gpu_power_limit",
                     "clocks.max.sm": "gpu_max_sm_clock"}


def parse_nvidia_smi(text: str) -> dict[str, str]:
    """The first GPU's line of `nvidia-smi --query-gpu=<NVIDIA_SMI_FIELDS> --format=csv,noheader`,
    keyed by our names; fields nvidia-smi cannot read ("[N/A]") are left out."""
    lines = text.strip().splitlines()
    if not lines:
        return {}
    values = [part.strip() for part in lines[0].split(",")]
    return {key: value for key, value in zip(NVIDIA_SMI_FIELDS.values(), values)
            if value and not value.startswith("[")}


def nvidia_smi() -> dict[str, str]:
    """GPU name, driver, power limit and maximum SM clock as nvidia-smi reports
    them (empty without a GPU)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_nvidia_smi(out)


def environment(extra: dict | None = None) -> dict:
    """What produced a number: host, Python, git commit, command line, plus `extra`."""
    env = {
        "host_platform": platform.platform(),
        "python": platform.python_version(),
        "git_commit": git_commit(),
        "command": command_line(),
        **nvidia_smi(),
    }
    env.update(extra or {})
    return env


def gpu_slug(name: str | None) -> str:
    """A short file-name-safe device name: 'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3'."""
    if not name:
        return "cpu"
    slug = name.lower().replace("nvidia", "").strip()
    return "-".join("".join(c if c.isalnum() else " " for c in slug).split())
