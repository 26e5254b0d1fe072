"""harness.bench_ranks: a stop keeps the set sizes that finished, written and named."""

import json

from harness import Terminated, bench_ranks


def test_a_stop_keeps_the_sizes_that_finished(tmp_path, capsys, monkeypatch):
    traces = [tmp_path / f"rank{r}.json" for r in range(2)]
    for t in traces:
        t.write_text("{}")
    timed = []

    def run_report(folder, out):
        if timed:
            raise Terminated("SIGTERM")
        timed.append(folder)
        return {"wall_s": 1.5, "peak_rss_mib": {"report": 100.0, "largest_worker": 50.0, "all_processes_sampled": 200.0},
                "kernels_md_lines": 10, "kernels_md_bytes": 1000, "report_html_bytes": 2000, "ranks_csv_rows": 8,
                "ranks_csv_bytes": 300}

    monkeypatch.setattr(bench_ranks, "copy_ranks", lambda files, n, folder, **kw: folder.mkdir(parents=True))
    monkeypatch.setattr(bench_ranks, "run_report", run_report)
    out = tmp_path / "b.json"
    assert bench_ranks.main([*map(str, traces), "--ranks", "8,64", "--out", str(out)]) == 130
    doc = json.loads(out.read_text())
    assert [r["ranks"] for r in doc["runs"]] == [8]
    assert doc["interrupted"] == "stopped by SIGTERM while timing 64 ranks; finished: 8"
    assert "Interrupted: stopped by SIGTERM while timing 64 ranks; finished: 8." in out.with_suffix(".md").read_text()
    err = capsys.readouterr().err
    assert err == (f"error: interrupted: stopped by SIGTERM while timing 64 ranks; finished: 8; the finished sizes "
                   f"are kept in {out}\n")


def test_the_table_says_its_answer_first_and_regenerates(tmp_path, capsys):
    """The committed 16-core FSDP2 table opens with its answer, read back from its document's
    runs here; a hand-edited answer is named stale by regenerate --check and rendered back."""
    import json
    import shutil
    from pathlib import Path

    from harness import regenerate

    committed = Path(__file__).parent.parent / "results" / "report-speed" / "at-scale"
    doc = json.loads((committed / "fsdp2-16cores.json").read_text())
    lo, hi = min(doc["runs"], key=lambda r: r["ranks"]), max(doc["runs"], key=lambda r: r["ranks"])
    first = (committed / "fsdp2-16cores.md").read_text().splitlines()[0]
    assert first == (f"From {lo['ranks']} to {hi['ranks']} ranks `harness.report` took {lo['wall_s']:.1f} -> "
                     f"{hi['wall_s']:.1f} s on 16 cores, its process peaked at {lo['peak_rss_mib']['report']:.0f} "
                     f"-> {hi['peak_rss_mib']['report']:.0f} MiB, and kernels.md has {lo['kernels_md_lines']} -> "
                     f"{hi['kernels_md_lines']} lines.")
    folder = tmp_path / "at-scale"
    folder.mkdir()
    for name in ("fsdp2-16cores.json", "fsdp2-16cores.md"):
        shutil.copy(committed / name, folder / name)
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 0
    md = folder / "fsdp2-16cores.md"
    md.write_text(md.read_text().replace(" ranks `harness.report` took", " ranks it took", 1))
    capsys.readouterr()
    assert regenerate.main(["--check", "--root", str(tmp_path)]) == 1
    assert capsys.readouterr().out.startswith(str(md))
    assert regenerate.main(["--root", str(tmp_path)]) == 0
    assert md.read_text().splitlines()[0] == first
