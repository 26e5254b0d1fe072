"""Where a kernel's warps wait, instruction by instruction, from an Nsight Compute source export.

    ncu --section WarpStateStats --section SourceCounters --import-source no -k regex:NAME \\
        --launch-count 1 -o prof python ...
    ncu -i prof.ncu-rep --page source --print-source sass --csv > sass.csv
    python -m harness.ncu_source sass.csv [--top 25] [--out summary.md]

`read_source` returns each profiled kernel's SASS instructions with how many
times warps executed them and the warp-state samples that landed on them, by
reason. `loops` groups consecutive instructions that ran equally often, as a
loop body's instructions do: in a warp-specialized kernel that separates the
producer's loop, whose waits overlap the consumers' work, from the consumers'
loop, whose waits are the kernel's time. Analysis returns data; rendering is
separate. (`python -m harness.ncu` summarizes a details export instead.)
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import gzip
import io
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
STALL_PREFIX = "stall_"
# The state of a warp in the cycle it issues: sampled like the stalls, but
# not a wait.
ISSUING = "selected"
# Samples whose reason the export has no column for (the per-reason columns
# can add up to less than the all-samples one).
OTHER = "other"


class NcuSourceError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Instruction:
    index: int  # position in the kernel's SASS
    sass: str
    executed: int  # warp-level executions
    samples: int  # warp-state samples on this instruction, every reason
    stalls: dict[str, int]  # reason -> samples; they add up to `samples` (OTHER: no column for it)


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    instructions: list[Instruction]

    @property
    def samples(self) -> int:
        return sum(i.samples for i in self.instructions)


@dataclasses.dataclass(frozen=True)
class Loop:
    """Consecutive instructions that warps executed the same number of times."""

    first: int
    last: int
    executed: int
    samples: int
    stalls: dict[str, int]


def _open(path: Path):
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return io.StringIO(raw.decode())


def _int(text: str) -> int:
    text = text.replace(",", "").strip()
    return int(float(text)) if text and text != "-" else 0


def read_source(path: str | Path) -> list[Kernel]:
    """The kernels of an `ncu --page source --print-source sass --csv` export
    (gzip-compressed or not), each with its instructions in SASS order."""
    path = Path(path)
    rows = list(csv.reader(_open(path)))
    kernels: list[Kernel] = []
    header: dict[str, int] | None = None
    for row in rows:
        if row[:1] == ["Kernel Name"]:
            kernels.append(Kernel(row[1] if len(row) > 1 else "?", []))
            header = None
        elif kernels and header is None:
            header = {name: i for i, name in enumerate(row)}
            missing = {"Source", SAMPLES, EXECUTED} - set(header)
            if missing:
                raise NcuSourceError(f"{path}: columns {sorted(missing)} missing; collect the SourceCounters "
                                     "section and export with: "
                                     "ncu -i X.ncu-rep --page source --print-source sass --csv")
            reasons = [n for n in header if n.startswith(STALL_PREFIX) and "(Not Issued)" not in n]
        elif header is not None and len(row) == len(header):
            code = kernels[-1].instructions
            samples = _int(row[header[SAMPLES]])
            stalls = {r[len(STALL_PREFIX):]: _int(row[header[r]]) for r in reasons}
            stalls[OTHER] = max(0, samples - sum(stalls.values()))
            code.append(Instruction(len(code), row[header["Source"]].strip(), _int(row[header[EXECUTED]]),
                                    samples, stalls))
    if not kernels or not any(k.instructions for k in kernels):
        raise NcuSourceError(f"{path}: not an ncu source export (export with: ncu -i X.ncu-rep --page source "
                             "--print-source sass --csv)")
    return kernels


def stall_totals(instructions: list[Instruction]) -> dict[str, int]:
    """Samples per reason over these instructions, largest first."""
    total: collections.Counter[str] = collections.Counter()
    for ins in instructions:
        total.update(ins.stalls)
    return dict(total.most_common())


def loops(kernel: Kernel, min_share: float = 0.01) -> list[Loop]:
    """Runs of consecutive instructions with one execution count that hold
    at least `min_share` of the kernel's samples, in SASS order."""
    code, total, out = kernel.instructions, kernel.samples, []
    start = 0
    for i in range(1, len(code) + 1):
        if i == len(code) or code[i].executed != code[start].executed:
            run = code[start:i]
            samples = sum(x.samples for x in run)
            if total and samples >= min_share * total:
                out.append(Loop(start, i - 1, code[start].executed, samples, stall_totals(run)))
            start = i
    return out


def hottest(kernel: Kernel, n: int = 25) -> list[Instruction]:
    """The n instructions with the most samples."""
    return sorted(kernel.instructions, key=lambda x: -x.samples)[:n]


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def _reasons(stalls: dict[str, int], whole: int, n: int = 3) -> str:
    top = [(r, s) for r, s in sorted(stalls.items(), key=lambda x: -x[1]) if s][:n]
    return ", ".join(f"{r} {_share(s, whole)}" for r, s in top)


def source_markdown(kernel: Kernel, source: str, *, top: int = 25, min_share: float = 0.01) -> str:
    total = kernel.samples
    lines = [f"# Warp-state samples of `{kernel.name}`", "",
             f"From `{source}`: {len(kernel.instructions)} SASS instructions, {total} samples. "
             f"`{ISSUING}` is the cycle a warp issues; every other reason is a wait; `{OTHER}`: samples "
             "whose reason the export has no column for.", "",
             "| reason | samples | share |", "|---|---|---|"]
    lines += [f"| {r} | {s} | {_share(s, total)} |" for r, s in stall_totals(kernel.instructions).items() if s]
    lines += ["", f"## Loops (consecutive instructions executed equally often, >= {min_share:.0%} of samples)", "",
              "| instructions | warp executions each | samples | share | top reasons |", "|---|---|---|---|---|"]
    for lp in loops(kernel, min_share):
        lines.append(f"| {lp.first}-{lp.last} | {lp.executed} | {lp.samples} | {_share(lp.samples, total)} | "
                     f"{_reasons(lp.stalls, lp.samples)} |")
    lines += ["", f"## The {top} instructions with the most samples", "",
              "| # | SASS | executed | samples | share | top reasons |", "|---|---|---|---|---|---|"]
    for ins in hottest(kernel, top):
        lines.append(f"| {ins.index} | `{ins.sass}` | {ins.executed} | {ins.samples} | {_share(ins.samples, total)} | "
                     f"{_reasons(ins.stalls, ins.samples, 2)} |")
    return "\n".join(lines) + "\n"
