"""Trim jax.profiler's trace-viewer export to a small fixture: the Python tracer's events go.

They are complete events named ``$...`` with no args (``$builtins isinstance``: about
100,000 of the 102,000 events of `flax_profiler_loop.py`'s trace) and no reader uses them.
The cut is made on the text, so every other event keeps the bytes jax.profiler wrote
(times as it prints doubles: ``"dur":1.3120000000000001``).

    python trim_trace_viewer.py DIR/plugins/profile/<run>/<host>.trace.json.gz jax/flax_loop.trace.json.gz
"""

import gzip
import json
import re
import sys

PYTHON_EVENT = r'\{"ph":"X","pid":\d+,"tid":\d+,"ts":[0-9.e+-]+,"dur":[0-9.e+-]+,"name":"\$[^"\\]*"\}'


def main() -> None:
    text = gzip.decompress(open(sys.argv[1], "rb").read()).decode()
    before = len(json.loads(text)["traceEvents"])
    trimmed, n = re.subn(PYTHON_EVENT + ",", "", text)
    trimmed, m = re.subn("," + PYTHON_EVENT + r"(?=\])", "", trimmed)
    assert len(json.loads(trimmed)["traceEvents"]) == before - n - m
    with gzip.open(sys.argv[2], "wt") as f:
        f.write(trimmed)
    print(f"{n + m} of {before} events dropped")


if __name__ == "__main__":
    main()
