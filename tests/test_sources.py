"""Trace sources as one shape (`harness.trace.sources.registry`): a new format is one module
of the package, which the common loader finds and dispatches to; the built-in formats are
registered; launch counting is the nsys source's, asked through the loader."""

from __future__ import annotations

import gzip
import sqlite3
import sys
from pathlib import Path

import pytest

import harness.trace.sources as sources_package
from harness.trace.profile import ProfileError
from harness.trace.sources import registry
from harness.trace.sources.load import launches_of, load_profile

DATA = Path(__file__).parent / "data"

# A whole source module, as someone adding a format would write it: rows `name,start,end` (ns).
TOY_SOURCE = '''
from pathlib import Path

from harness.trace.profile import Kernel, Profile
from harness.trace.sources.registry import LoadOptions, source


@source("toy-csv", claims=lambda p: p.name.endswith(".toycsv"), describe="a toy .toycsv",
        launches=lambda p, o: {"step": len(p.read_text().splitlines())})
def load(path: Path, options: LoadOptions) -> Profile:
    rows = [line.split(",") for line in path.read_text().splitlines()]
    kernels = [Kernel(name, int(start), int(end)) for name, start, end in rows]
    return Profile(str(path), options.label or path.stem, "toy", kernels, [])
'''


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The toy module planted in a folder of the sources package's path (a new file of it)."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "toy_csv.py").write_text(TOY_SOURCE)
    monkeypatch.setattr(sources_package, "__path__", [*sources_package.__path__, str(folder)])
    yield tmp_path
    registry.unregister("toy-csv")
    sys.modules.pop("harness.trace.sources.toy_csv", None)


def test_a_planted_source_module_is_loaded_by_the_common_loader(toy: Path) -> None:
    path = toy / "run.toycsv"
    path.write_text("gemm,100,350\nsoftmax,400,460\ngemm,500,750\n")
    profile = load_profile(path, label="mine")
    assert (profile.source, profile.label) == ("toy", "mine")
    kt = profile.kernels
    assert sorted(kt.name_of(i) for i in range(len(kt))) == ["gemm", "gemm", "softmax"]
    assert int(kt.duration.sum()) == 250 + 60 + 250
    assert launches_of(path) == {"step": 3}
    assert "toy-csv" in registry.discover()


def test_a_file_no_source_claims_names_every_format_including_a_new_one(toy: Path) -> None:
    path = toy / "notes.txt"
    path.write_text("x")
    with pytest.raises(ProfileError, match=r"not a profile; expected .*\.nsys-rep.*a toy \.toycsv"):
        load_profile(path)


def test_the_built_in_sources_are_registered_and_claim_their_files() -> None:
    found = registry.discover()
    assert {"nsys-rep", "nsys-sqlite", "profiler-json", "jax-xplane"} <= set(found)
    claims = {name: registry.source_of(Path(name)).name for name in
              ("x.nsys-rep", "x.sqlite.gz", "x.sqlite", "x.json", "x.pt.trace.json.gz", "x.xplane.pb")}
    assert claims == {"x.nsys-rep": "nsys-rep", "x.sqlite.gz": "nsys-sqlite", "x.sqlite": "nsys-sqlite",
                      "x.json": "profiler-json", "x.pt.trace.json.gz": "profiler-json", "x.xplane.pb": "jax-xplane"}


def test_launch_calls_come_from_the_nsys_source_and_none_from_a_torch_trace(tmp_path: Path) -> None:
    """The nsys export's launch calls per step, counted here with SQL independently; a
    torch.profiler trace's source records none."""
    path = DATA / "torch_tiny_attn" / "torch_tiny_attn.sqlite.gz"
    plain = tmp_path / "p.sqlite"
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    db = sqlite3.connect(plain)
    steps = db.execute("SELECT n.start, n.end FROM NVTX_EVENTS n LEFT JOIN StringIds s ON n.textId = s.id "
                       "WHERE COALESCE(n.text, s.value) = 'step' AND n.end IS NOT NULL").fetchall()
    warm = db.execute("SELECT n.start, n.end FROM NVTX_EVENTS n LEFT JOIN StringIds s ON n.textId = s.id "
                      "WHERE COALESCE(n.text, s.value) = 'warmup' AND n.end IS NOT NULL").fetchall()
    calls = db.execute("SELECT r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON r.nameId = s.id "
                       "WHERE s.value LIKE '%Launch%'").fetchall()
    db.close()
    measured = [(s, e) for s, e in steps if not any(ws <= s and e <= we for ws, we in warm)]
    inside = sum(any(s <= c <= e for s, e in measured) for c, in calls)
    got = launches_of(path)
    assert inside and got["step"].per_step == pytest.approx(inside / len(measured))
    assert launches_of(DATA / "hta" / "mi250_rocm.json.gz") == {}
