"""DDP's bucket size per backend: the compiled backends default to larger buckets (each
bucket boundary cuts their graph), eager torch keeps DDP's own, the option wins, and the
run document records the size that ran."""

from __future__ import annotations

import pytest
import torch

from harness.backends.parallel import DDP_DEFAULT_BUCKET_MB, bucket_mb
from harness.backends.torch import parallel as torch_parallel
from harness.config import get_config
from harness.reports.run import format_data_parallel
from harness.runs.distributed import data_parallel_record
from harness.timing.spec import RunSpec


@pytest.mark.parametrize(("backend", "given", "expected"), [
    ("torch", None, 25.0), ("torch-compile", None, 250.0), ("torch-compile-cg", None, 250.0),
    ("torch", 100.0, 100.0), ("torch-compile", 100.0, 100.0)])
def test_bucket_size_per_backend(backend: str, given: float | None, expected: float) -> None:
    assert bucket_mb(RunSpec(backend=backend, model="tiny", ctx=16, ddp_bucket_mb=given)) == expected


class _CapturedDDP(torch.nn.Module):
    """Stands in for DistributedDataParallel: keeps the module and the keyword arguments."""

    def __init__(self, module: torch.nn.Module, **kwargs) -> None:
        super().__init__()
        self.module, self.kwargs = module, kwargs


@pytest.mark.parametrize(("backend", "given", "expected"), [
    ("torch", None, 25.0), ("torch-compile", None, 250.0), ("torch", 64.0, 64.0), ("torch-compile", 64.0, 64.0)])
def test_the_wrap_gets_the_bucket_size(monkeypatch, backend: str, given: float | None, expected: float) -> None:
    import torch.nn.parallel

    import torch_impl

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", _CapturedDDP)
    session = type("S", (), {})()
    session.device = torch.device("cpu")
    session.model = torch_impl.TransformerLM(get_config("tiny"))
    torch_parallel.distribute(session, RunSpec(backend=backend, model="tiny", ctx=16, data_parallel=2, ddp_bucket_mb=given))
    assert session.model.kwargs["bucket_cap_mb"] == expected
    assert session.model.kwargs["gradient_as_bucket_view"] is True


@pytest.mark.parametrize(("backend", "parallel", "recorded"), [
    ("torch", "ddp", DDP_DEFAULT_BUCKET_MB), ("torch-compile", "ddp", 250.0), ("torch", "fsdp", None),
    ("jax", "ddp", None)])
def test_the_record_names_the_bucket_size_that_ran(backend: str, parallel: str, recorded: float | None) -> None:
    opts = RunSpec(backend=backend, model="tiny", ctx=16, data_parallel=2, parallel=parallel, batch=2)
    medians = [{"forward": 1.0, "backward": 2.0, "optimizer": 0.5, "step": 3.5}] * 2
    dp = data_parallel_record(medians, opts, "note")
    assert dp["bucket_mb"] == recorded
    head = format_data_parallel({"data_parallel": dp, "options": {"backend": backend}})[0]
    if recorded is None:
        assert "MB buckets" not in head
    else:
        assert f"({'DDP' if parallel == 'ddp' else ''}, {recorded:g} MB buckets)" in head
