"""kernels.png drawn in a forked process: the same picture as drawn in place, failures in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.reports import plot
from harness.trace.analyses.breakdown import breakdown, load_profile
from harness.trace.profile import ProfileError

TORCH = Path(__file__).parent / "data" / "torch_small_train" / "torch_small_train.sqlite.gz"


@pytest.fixture(scope="module")
def bds():
    return [breakdown(load_profile(TORCH))]


@pytest.mark.parametrize("fork", [True, False])
def test_drawer_draws_what_plot_draws(tmp_path: Path, bds, fork: bool, monkeypatch) -> None:
    # a test run may hold threads of earlier tests: where they are, the drawer draws in place
    monkeypatch.setattr(plot.threading, "active_count", lambda: 1)
    if not fork:
        monkeypatch.setattr(plot.sys, "platform", "darwin")  # no fork: drawn in this process at wait()
    plot.plot(tmp_path / "direct.png", bds)
    with plot.Drawer() as drawer:
        assert (drawer._proc is not None) == fork
        drawer.draw(tmp_path / "kernels.png", bds)
        assert drawer.wait() == tmp_path / "kernels.png"
    assert (tmp_path / "kernels.png").read_bytes() == (tmp_path / "direct.png").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["direct.png", "kernels.png"]  # no temp file left


@pytest.mark.parametrize("fork", [True, False])
def test_a_failed_drawing_is_one_line(tmp_path: Path, bds, fork: bool, monkeypatch) -> None:
    monkeypatch.setattr(plot.threading, "active_count", lambda: 1 if fork else 2)
    phase = next(iter(bds[0].phases.values()))
    bad = dataclasses.replace(phase, kernels=[dataclasses.replace(phase.kernels[0], category="no such category")])
    broken = dataclasses.replace(bds[0], phases={"step": bad})
    with plot.Drawer() as drawer:
        assert (drawer._proc is not None) == fork
        drawer.draw(tmp_path / "kernels.png", [broken])
        with pytest.raises(ProfileError, match=r"kernels.png could not be drawn \(ValueError: .*--no-plot skips it"):
            drawer.wait()
    assert not list(tmp_path.iterdir())


def test_a_drawer_never_sent_work_ends_its_child() -> None:
    drawer = plot.Drawer()
    proc = drawer._proc
    drawer.close()
    assert proc is None or proc.exitcode == 0


def test_the_suffix_names_the_format(tmp_path: Path, bds) -> None:
    plot.plot(tmp_path / "kernels.svg", bds)  # compare draws the page's vector copy this way
    assert (tmp_path / "kernels.svg").read_text().lstrip().startswith("<?xml")
