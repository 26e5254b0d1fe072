"""The one markdown-table helper of every report."""

from __future__ import annotations

from collections.abc import Sequence


def markdown_table(header: Sequence[object], rows: Sequence[Sequence[object]]) -> list[str]:
    """Lines of a GitHub markdown table: the header, the rule, one line per row (cells via str)."""
    return ["| " + " | ".join(str(c) for c in header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]
