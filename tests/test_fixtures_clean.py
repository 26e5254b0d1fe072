"""The committed profile fixtures record what ran, not the machine they were captured on:
no environment block (nsys keeps the process environment as NUL-separated NAME=value
strings), no absolute path of the export, no checkout path."""

from __future__ import annotations

import gzip
import sqlite3
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
FIXTURES = sorted(DATA.rglob("*.sqlite.gz"))


def test_there_are_fixtures_to_check() -> None:
    assert len(FIXTURES) >= 10


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: str(p.relative_to(DATA)))
def test_fixture_names_no_machine(path: Path, tmp_path: Path) -> None:
    db_path = tmp_path / "x.sqlite"
    db_path.write_bytes(gzip.decompress(path.read_bytes()))
    with sqlite3.connect(db_path) as db:
        blocks = db.execute("SELECT count(*) FROM StringIds WHERE instr(CAST(value AS BLOB), X'00') > 0 "
                            "AND value GLOB '[A-Za-z_]*=*'").fetchone()[0]
        tables = {t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        paths = (db.execute("SELECT value FROM META_DATA_EXPORT WHERE name LIKE '%PATH%'").fetchall()
                 if "META_DATA_EXPORT" in tables else [])
    assert blocks == 0
    assert all("/" not in value for (value,) in paths), paths
    raw = db_path.read_bytes()
    assert b"HOME=" not in raw and str(Path(__file__).resolve().parents[1]).encode() not in raw
