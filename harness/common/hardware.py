"""Per-GPU datasheet tables: peak throughput per dtype (MFU), HBM bandwidth (roofs, optimizer
bandwidth) and device memory (fit predictions)."""

from __future__ import annotations

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


# DRAM (HBM) bandwidth in TB/s from NVIDIA's datasheets; same lookup rule as PEAK_TFLOPS
# ("A100" alone is the 40GB part, whose name carries no size on some drivers).
HBM_TBPS: tuple[tuple[str, float], ...] = (
    ("H200", 4.8),
    ("H100 PCIe", 2.0),
    ("H100 NVL", 3.9),
    ("H100", 3.35),  # SXM5
    ("A100 80GB", 2.0),
    ("A100-SXM4-80GB", 2.0),
    ("A100", 1.56),
    ("L40S", 0.864),
    ("L4", 0.3),
    ("A10", 0.6),
)


def hbm_tbps(device_name: str | None) -> float | None:
    """Datasheet DRAM bandwidth of this device in TB/s, or None when it is not in the table."""
    if not device_name:
        return None
    return next((tbps for key, tbps in HBM_TBPS if key in device_name), None)


# Device memory in MiB as nvidia-smi reports it (`memory.total`), ordered like
# PEAK_TFLOPS: the first key that is a substring of the device name wins, so the
# 80 GB A100 names come before the plain "A100" of the 40 GB parts.
MEMORY_MIB: tuple[tuple[str, int], ...] = (
    ("H200", 143771),  # 141 GB HBM3e
    ("H100 NVL", 95830),  # 94 GB
    ("H100", 81559),  # 80 GB (SXM5 and PCIe)
    ("A100-SXM4-80GB", 81920),
    ("A100 80GB", 81920),
    ("A100", 40960),  # 40 GB
    ("L40S", 46068),  # 48 GB
    ("L4", 23034),  # 24 GB
    ("A10", 23028),  # 24 GB
)


def memory_mib(device_name: str | None) -> int | None:
    """Datasheet device memory in MiB for this device, or None when it is not in the table."""
    if not device_name:
        return None
    return next((mib for key, mib in MEMORY_MIB if key in device_name), None)
