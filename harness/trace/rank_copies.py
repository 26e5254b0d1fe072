"""N-rank sets built from real per-rank torch.profiler traces, for testing and timing the
report at any number of ranks.

    copy_ranks([rank0, rank1], n=64, out=folder, seed=0, stragglers=(5,))

Rank r is a copy of source ``r % len(sources)``: its ``distributedInfo`` says rank r of n,
and every timestamp and duration is stretched about the trace's first timestamp by a
factor near 1 (drawn with `seed` from a few levels within ±`jitter`), so the ranks
differ as real ones do; each rank in `stragglers` is stretched by `straggler` (default
1.3: 30% slower in every phase), so a slow rank is planted where the test knows it. The
ranks share the source's clock, so their collectives still align. A stretched trace is
built once per (source, factor) and its compressed bytes reused (a gzip file may hold
several members, read as one), so a 512-rank set takes seconds to write.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Sequence
from pathlib import Path

LEVELS = 8  # distinct stretch factors among the ordinary ranks


def _stretched_events(events: list[dict], factor: float) -> str:
    t0 = min(e["ts"] for e in events if "ts" in e)
    out = []
    for e in events:
        if "ts" in e and factor != 1.0:
            e = dict(e, ts=t0 + (e["ts"] - t0) * factor)
            if "dur" in e:
                e["dur"] = e["dur"] * factor
        out.append(e)
    return json.dumps(out, separators=(",", ":"))


def copy_ranks(sources: Sequence[str | Path], n: int, out: str | Path, seed: int = 0, jitter: float = 0.02,
               stragglers: Sequence[int] = (), straggler: float = 1.3) -> list[Path]:
    """Write ranks 0..n-1 as ``out/rank<r>.json.gz`` (module docstring); returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    levels = [1.0 + jitter * (2 * k / (LEVELS - 1) - 1) for k in range(LEVELS)]
    docs = [json.loads(gzip.decompress(Path(s).read_bytes())) for s in sources]
    bodies: dict[tuple[int, float], bytes] = {}
    paths = []
    for r in range(n):
        src = r % len(docs)
        factor = straggler if r in stragglers else rng.choice(levels)
        if (src, factor) not in bodies:
            events = _stretched_events(docs[src]["traceEvents"], factor)
            bodies[src, factor] = gzip.compress(f',"traceEvents":{events}}}'.encode(), compresslevel=1)
        head = {k: v for k, v in docs[src].items() if k != "traceEvents"}
        info = dict(head.get("distributedInfo") or {}, rank=r, world_size=n)
        if "pg_config" in info:
            info["pg_config"] = [dict(pg, pg_size=n, ranks=list(range(n))) for pg in info["pg_config"]]
        head["distributedInfo"] = info
        path = out / f"rank{r}.json.gz"
        path.write_bytes(gzip.compress(json.dumps(head)[:-1].encode(), compresslevel=1) + bodies[src, factor])
        paths.append(path)
    return paths
