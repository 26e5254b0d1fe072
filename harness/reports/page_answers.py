"""The generated blocks that open a page with its answer (`doc_blocks` names them): why each pair
of a profiled compare's backends differs, the answer a generated report opens with, quoted, and
the verdicts of parity documents."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

from harness.common.answer import NOISE_WORDS, speed
from harness.diffs.decompose import diff_runs
from harness.diffs.inputs import resolve
from harness.reports.diff import causes
from harness.timing.parity import ParityResult, ParityRow, verdict


def why(folder: Path, root: Path) -> str:
    """Why each pair of a profiled compare's backends differs: per pair (in `harness.diff`'s
    order), B's speed against A over the whole step under the profiler and the two largest
    parts of the gap (`harness.reports.diff.causes`), decomposed as `harness.diff` does."""
    runs = resolve(folder)
    lines = []
    for a, b in itertools.combinations(runs, 2):
        d = diff_runs(a, b)
        p = d.step
        if p is None:
            raise ValueError(f"{a.label} and {b.label} have no step in common")
        if not p.parts:
            raise ValueError("no profile to decompose the step's gap with: the block takes a compare folder "
                             "run with --nsys (kernels.json beside its summary.json)")
        name_a, name_b = (r.label.rpartition(":")[2] for r in (a, b))
        lines.append(f"- **{name_b}** (B) against **{name_a}** (A): {speed(p.a_ms, p.b_ms)} per step under the "
                     f"profiler, {NOISE_WORDS[p.in_noise]}. " + " ".join(causes(p, 2)))
    return "\n".join(lines) + "\n"


def parity(folder: Path, root: Path) -> str:
    """One line per `harness.parity` document (.json) in `folder`: what it compared and its
    verdict (`harness.timing.parity.verdict`)."""
    lines = []
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        if not (isinstance(doc, dict) and {"rows", "tolerances", "attention"} <= doc.keys()):
            continue
        others = list(doc["attention"])[1:]
        rows = [ParityRow(r["quantity"], r["tensor"], r["rel_err"], r["tol"], r.get("backend", others[0]))
                for r in doc["rows"]]
        result = ParityResult(doc["model"], doc["dtype"], doc["device"], doc["batch"], doc["ctx"], doc["steps"],
                              doc["attention"], rows)
        gpu = (doc.get("env") or {}).get("gpu_name") or doc["device"]
        attention = ", ".join(f"{b} {a}" for b, a in doc["attention"].items())
        lines.append(f"- `{path.name}`: `{doc['model']}` {doc['dtype']} on {gpu}, {doc['steps']} AdamW steps, "
                     f"{' and '.join(others)} against eager torch ({attention} attention): {verdict(result)}")
    if not lines:
        raise ValueError(f"{folder} holds no harness.parity document")
    return "\n".join(lines) + "\n"


SEE = re.compile(r" \(see: ([^)]*)\)")


def answer(path: Path, root: Path) -> str:
    """The answer a generated report (`path`, a .md under `root`) opens with, quoted: the lines of
    its "## The answer" section up to its rules, else its first paragraph; each "(see: SECTION)"
    pointer names the report it points into."""
    lines = path.read_text().splitlines()
    rel = path.relative_to(root).as_posix()
    if "## The answer" in lines:
        body = []
        for line in lines[lines.index("## The answer") + 1:]:
            if line.startswith(("#", "Rules:")):
                break
            body.append(line)
    else:
        start = next((i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")), len(lines))
        end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
        body = lines[start:end]
    quoted = "\n".join(body).strip()
    if not quoted:
        raise ValueError(f"{rel} opens with no answer (no '## The answer' section, no first paragraph)")
    return SEE.sub(lambda m: f" (`{rel}`: {m[1]})", quoted) + f"\n\n(From `{rel}`.)\n"
