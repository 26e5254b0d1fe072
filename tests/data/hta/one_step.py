"""Make `trace_compare_base_one_step.json.gz`: HTA's `trace_compare/base` trace without its
second `ProfilerStep` (#1010), so that one step is left.

With fewer than two ProfilerSteps HTA filters nothing: it keeps the GPU activities whose
launch is not in the trace (16 of this trace's 18), where with two it keeps only those
launched before the last step began. The cut is made on the text: every other event keeps
its bytes.

    python tests/data/hta/one_step.py
"""

import gzip
import json
import re
from pathlib import Path

HERE = Path(__file__).parent
STEP = r'\{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1010", [^{}]*"args": \{[^{}]*\}\}, '


def main() -> None:
    text = gzip.decompress((HERE / "trace_compare_base.json.gz").read_bytes()).decode()
    cut, n = re.subn(STEP, "", text)
    events = json.loads(cut)["traceEvents"]
    assert n == 1 and len(events) == len(json.loads(text)["traceEvents"]) - 1
    assert [e["name"] for e in events if e["name"].startswith("ProfilerStep")] == ["ProfilerStep#1009"]
    (HERE / "trace_compare_base_one_step.json.gz").write_bytes(gzip.compress(cut.encode(), mtime=0))


if __name__ == "__main__":
    main()
