"""The typed documents (`harness.common.documents`): every committed result document reads
into its record and writes back unchanged, a document of another kind is refused in one
line, and no module outside documents.py spells a schema id."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from harness.common import documents
from harness.common.documents import (
    CompareDocument,
    DiffDocument,
    DocumentError,
    RunDocument,
    Status,
    SweepCell,
    SweepDocument,
)

ROOT = Path(__file__).resolve().parent.parent
KINDS = {k.SCHEMA: k for k in (RunDocument, CompareDocument, DiffDocument, SweepDocument, SweepCell)}


def _committed() -> dict[str, list[tuple[str, dict]]]:
    """Schema id -> (where, document) of every document under results/ and tests/data/."""
    files = subprocess.run(["git", "ls-files", "results", "tests/data"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    found: dict[str, list[tuple[str, dict]]] = {}
    for name in files:
        if not name.endswith((".json", ".jsonl")):
            continue
        text = (ROOT / name).read_text()
        lines = text.splitlines() if name.endswith(".jsonl") else [text]
        for i, line in enumerate(lines):
            try:
                doc = json.loads(line)
            except ValueError:
                continue  # a torn line of a killed sweep
            if isinstance(doc, dict) and doc.get("schema") in KINDS:
                found.setdefault(doc["schema"], []).append((f"{name}:{i + 1}", doc))
    return found


COMMITTED = _committed()


@pytest.mark.parametrize("schema", sorted(KINDS))
def test_every_committed_document_round_trips(schema: str) -> None:
    docs = COMMITTED.get(schema, [])
    assert docs, f"no committed {schema} document"
    for where, doc in docs:
        record = KINDS[schema].from_dict(doc, where)
        back = record.to_dict()
        assert back == doc, where
        assert list(back) == list(doc), where  # key order too: a rewritten file reads the same


def test_committed_runs_read_typed() -> None:
    """The typed fields carry the document's values (the committed OOM run among them: a JAX run
    out of memory in its fused step, `tests/data/oom/`)."""
    runs = [RunDocument.from_dict(doc, where) for where, doc in COMMITTED[documents.RUN_SCHEMA]]
    assert {r.status for r in runs} == {Status.OK, Status.OOM}
    for (_, doc), run in zip(COMMITTED[documents.RUN_SCHEMA], runs, strict=True):
        assert run.ok == (doc["status"] == "ok") and run.backend == doc["options"]["backend"]
        assert run.phases == (doc.get("phases") or {})
        assert (run.error is None) == (doc["error"] is None)
        if run.error:
            assert run.message == doc["error"]["message"] and run.error.phase == doc["error"]["phase"]
    summaries = [CompareDocument.from_dict(d, w) for w, d in COMMITTED[documents.COMPARE_SCHEMA]]
    assert sum(len(s.runs) for s in summaries) == sum(len(d["runs"]) for _, d in COMMITTED[documents.COMPARE_SCHEMA])
    cells = [SweepCell.from_dict(d, w) for w, d in COMMITTED[documents.SWEEP_CELL_SCHEMA]]
    assert {c.status for c in cells} >= {Status.OK, Status.OOM}
    assert all((c.result is None) == (c.status in (Status.CRASHED, Status.TIMEOUT)) for c in cells)


@pytest.mark.parametrize("kind", list(KINDS.values()))
def test_a_document_of_another_kind_is_refused_in_one_line(kind) -> None:
    other = next(s for s in KINDS if s != kind.SCHEMA)
    with pytest.raises(DocumentError) as wrong:
        kind.from_dict({"schema": other, "status": "ok"}, "x.json")
    assert str(wrong.value) == f"x.json: schema {other!r}, expected a {kind.SCHEMA} document"
    with pytest.raises(DocumentError) as missing:
        kind.from_dict({"status": "ok"}, "x.json")
    assert str(missing.value) == f"x.json: no schema, expected a {kind.SCHEMA} document"
    assert isinstance(wrong.value, ValueError) and "\n" not in str(wrong.value) + str(missing.value)


def test_a_status_outside_the_vocabulary_is_refused() -> None:
    with pytest.raises(DocumentError, match=r"^x.json: status 'fine' is none of ok, oom, error"):
        RunDocument.from_dict({"schema": documents.RUN_SCHEMA, "status": "fine"}, "x.json")


def test_a_comparison_record_of_a_run_without_document_reads() -> None:
    """compare's own record of a process that left no document: no schema of its own."""
    summary = {"schema": documents.COMPARE_SCHEMA, "ok": False,
               "runs": {"jax": {"status": "interrupted", "error": {"phase": "process", "message": "stopped"}}}}
    record = CompareDocument.from_dict(summary)
    assert record.runs["jax"].status is Status.INTERRUPTED and record.runs["jax"].message == "stopped"
    assert record.to_dict() == summary


def test_a_new_record_writes_schema_first() -> None:
    doc = RunDocument(status=Status.OOM, options={"backend": "jax"}).to_dict()
    assert doc == {"schema": "harness.run/1", "status": "oom", "error": None, "options": {"backend": "jax"}}


def test_a_record_reads_its_body_by_key_like_the_document() -> None:
    where, doc = next((w, d) for w, d in COMMITTED[documents.RUN_SCHEMA] if d["status"] == "oom")
    run = RunDocument.from_dict(doc, where)
    assert run["env"] == doc["env"] and run.get("config") == doc["config"] and run["schema"] == doc["schema"]
    assert run["options"] == doc["options"] and run["status"] == "oom" and run.get("no such key", 7) == 7
    assert not run.ok and run.phases == {} and run.message == doc["error"]["message"]
    with pytest.raises(KeyError):
        run["no such key"]


def test_no_schema_id_is_spelled_outside_documents() -> None:
    """Every schema id lives in harness/common/documents.py; other modules import it."""
    spelled = re.compile(r"""["']harness\.[a-z_.]+/\d*["']""")
    offenders = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "harness").rglob("*.py"))
                 if path.name != "documents.py" or path.parent.name != "common"
                 for n, line in enumerate(path.read_text().splitlines(), 1) if spelled.search(line)]
    assert not offenders, f"schema ids spelled outside harness/common/documents.py: {offenders}"


def test_regenerate_refuses_a_diff_json_of_another_kind(tmp_path) -> None:
    """regenerate reads diff.json through DiffDocument: another document there is named in one line."""
    from harness import regenerate

    (tmp_path / "diff.json").write_text(json.dumps({"schema": documents.RUN_SCHEMA, "status": "ok",
                                                    "a_label": "x:torch", "b_label": "y:jax"}))
    with pytest.raises(regenerate.Unrenderable) as refused:
        regenerate.render_diff(tmp_path, tmp_path, False)
    assert str(refused.value) == f"{tmp_path / 'diff.json'}: schema 'harness.run/1', expected a harness.diff/1 document"


def test_scaling_names_a_run_whose_status_is_outside_the_vocabulary(tmp_path, capsys) -> None:
    """A run document whose status is no Status is named, not skipped as one that did not finish."""
    from harness import scaling

    path = tmp_path / "n1.json"
    path.write_text(json.dumps({"schema": documents.RUN_SCHEMA, "status": "finished", "options": {}}))
    assert scaling.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: not a harness.run result document (")
    assert "status 'finished' is none of ok, oom, error" in err
