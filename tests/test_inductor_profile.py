"""Inductor's kernels in a real profile: a torch.compile training loop on an H100
(tests/data/user_loops/compiled_loop.sqlite.gz, see the README there) loaded by
`harness.trace.analyses.breakdown.load_profile`, each kernel family classified as its fused ops
say, with the expected counts taken from the SQLite export itself."""

import fnmatch
import gzip
import sqlite3
from pathlib import Path

import pytest

from harness.trace.analyses.breakdown import load_profile
from harness.trace.kernels import Category, classify

FIXTURE = Path(__file__).parent / "data" / "user_loops" / "compiled_loop.sqlite.gz"

# (kernel-name glob, category): Inductor names a Triton kernel after the ATen ops it fuses.
FAMILIES = [
    ("triton_per_fused__softmax_*", Category.SOFTMAX),  # attention softmax, forward and backward
    ("triton_*_mean_mul_pow_rsqrt_*", Category.NORM),  # RMSNorm forward, fused with the residual add
    ("nvjet_sm90_*", Category.GEMM),  # cuBLASLt's Hopper GEMMs, which Inductor calls for the matmuls
    ("*multi_tensor_apply_kernel*", Category.OPTIMIZER),  # the fused AdamW
    ("triton_poi_fused__unsafe_view_mul_silu_*", Category.ELEMENTWISE),  # SwiGLU, forward and backward
    ("triton_poi_fused__to_copy_*", Category.MEMORY),  # bf16 casts of weights and activations
    ("triton_poi_fused_clone_transpose_view_*", Category.MEMORY),  # head layout changes
    ("triton_poi_fused_stack_transpose_view_*", Category.MEMORY),
    ("triton_poi_fused__unsafe_view_clone_transpose_unbind_view_*", Category.MEMORY),  # q, k, v split
]


@pytest.fixture(scope="module")
def sql_names(tmp_path_factory) -> list[str]:
    """Every kernel's demangled name, read straight from the export with SQL."""
    db = tmp_path_factory.mktemp("compiled") / "compiled_loop.sqlite"
    db.write_bytes(gzip.decompress(FIXTURE.read_bytes()))
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                           "JOIN StringIds s ON s.id = k.demangledName").fetchall()
    return [name for (name,) in rows]


@pytest.fixture(scope="module")
def profile():
    return load_profile(FIXTURE)


def _names(profile) -> list[str]:
    """Each kernel's name, in the profile's order."""
    table = profile.kernels
    return [table.names[i] for i in table.name]


@pytest.mark.parametrize("pattern, category", FAMILIES, ids=[p for p, _ in FAMILIES])

def test_inductor_kernel_family_classifies_as_its_ops_say(sql_names, profile, pattern, category):
    expected = sum(fnmatch.fnmatchcase(name, pattern) for name in sql_names)
    assert expected > 0, f"no {pattern} kernel in the fixture"
    found = [n for n in _names(profile) if fnmatch.fnmatchcase(n, pattern)]
    assert len(found) == expected  # every kernel of the export reached the profile
    wrong = {name: classify(name).value for name in found if classify(name) is not category}
    assert not wrong, wrong


def test_every_triton_kernel_has_a_category(sql_names, profile):
    triton = [n for n in _names(profile) if n.startswith("triton_")]
    assert len(triton) == sum(name.startswith("triton_") for name in sql_names) > 1000
    assert {name for name in triton if classify(name) is Category.OTHER} == set()

