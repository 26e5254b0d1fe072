"""The GPU datasheet table: one row per GPU with its dense peak per dtype (MFU), HBM
bandwidth (roofs, optimizer bandwidth), device memory (fit predictions) and compute
capability (the tensor-core rate per SM cycle the roofline scales ncu's pipe counter by)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    pattern: str  # a substring of the device name; the first row whose pattern matches wins
    peak_tflops: dict[str, float]  # dense (no sparsity) TFLOP/s per dtype
    hbm_tbps: float  # DRAM bandwidth, TB/s
    memory_mib: int  # device memory as nvidia-smi reports it (`memory.total`)
    compute_capability: str
    # dense f16/bf16 tensor-core FLOPs per SM per cycle: the datasheet peak / (SMs x boost
    # clock), e.g. H100 SXM 989.4e12 / (132 x 1.83e9) = 4096; None where not worked out
    sm_tensor_flops: int | None = None
    # the SM clock (MHz) of the datasheet's dense peak, where the peak is SMs x sm_tensor_flops
    # x this clock (MFU at the clock a run held scales the peak by it); None where not worked out
    boost_mhz: float | None = None


# From NVIDIA's datasheets. fp32 = plain FP32 on CUDA cores (what torch uses with TF32 off),
# tf32 = TF32 tensor cores, bf16 = dense bf16 tensor cores. Ordered so that the first match
# is the right one: "H100 PCIe" before "H100", the 80 GB A100 names before the plain "A100"
# of the 40 GB part (whose name carries no size on some drivers), "L40S" before "L4",
# "A100" before "A10".
_HOPPER = {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9}  # H100 SXM5 and H200
_A100 = {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5}
GPUS: tuple[Gpu, ...] = (
    Gpu("H200", _HOPPER, 4.8, 143771, "9.0", 4096, 1830),  # 141 GB HBM3e
    Gpu("H100 PCIe", {"bf16": 756.0, "tf32": 378.0, "fp32": 51.2}, 2.0, 81559, "9.0", 4096),
    Gpu("H100 NVL", {"bf16": 835.5, "tf32": 417.5, "fp32": 59.8}, 3.9, 95830, "9.0", 4096),  # 94 GB
    Gpu("H100", _HOPPER, 3.35, 81559, "9.0", 4096, 1830),  # SXM5, 80 GB
    Gpu("A100-SXM4-80GB", _A100, 2.0, 81920, "8.0", 2048, 1410),
    Gpu("A100 80GB", _A100, 2.0, 81920, "8.0", 2048, 1410),
    Gpu("A100", _A100, 1.56, 40960, "8.0", 2048, 1410),  # 40 GB
    Gpu("L40S", {"bf16": 362.0, "tf32": 183.0, "fp32": 91.6}, 0.864, 46068, "8.9"),  # 48 GB
    Gpu("L4", {"bf16": 121.0, "tf32": 60.0, "fp32": 30.3}, 0.3, 23034, "8.9"),  # 24 GB
    Gpu("A10", {"bf16": 125.0, "tf32": 62.5, "fp32": 31.2}, 0.6, 23028, "8.6"),  # 24 GB
)


def gpu(device_name: str | None) -> Gpu | None:
    """The table's row for this device, or None when it is not in the table."""
    if not device_name:
        return None
    return next((row for row in GPUS if row.pattern in device_name), None)


def peak_tflops(device_name: str | None, dtype: str) -> float | None:
    """Datasheet peak for this device and dtype, or None when the device is not in the table."""
    row = gpu(device_name)
    return row.peak_tflops.get(dtype) if row else None


def hbm_tbps(device_name: str | None) -> float | None:
    """Datasheet DRAM bandwidth of this device in TB/s, or None when it is not in the table."""
    row = gpu(device_name)
    return row.hbm_tbps if row else None


def memory_mib(device_name: str | None) -> int | None:
    """Datasheet device memory in MiB for this device, or None when it is not in the table."""
    row = gpu(device_name)
    return row.memory_mib if row else None


def boost_mhz(device_name: str | None) -> float | None:
    """The SM clock of this device's datasheet peak in MHz, or None where it is not worked out."""
    row = gpu(device_name)
    return row.boost_mhz if row else None


def sm_tensor_flops(compute_capability: str) -> int | None:
    """Dense f16/bf16 tensor-core FLOPs per SM per cycle of the architecture, or None."""
    return next((row.sm_tensor_flops for row in GPUS
                 if row.compute_capability == compute_capability and row.sm_tensor_flops), None)
