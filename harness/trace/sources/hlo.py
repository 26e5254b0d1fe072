"""XLA's optimized HLO text, read: the source the layer join
(`harness.trace.analyses.hlo_join`) takes its schedule from.

The JAX session writes, beside its result or profile ``X.*``, a folder ``X.hlo`` with one
``<phase>.txt`` per compiled phase (``compiled.as_text()``); `parse_hlo` reads one into an
`HloModule`: computations, and per instruction its name, opcode, fusion kind, custom-call
target, called computations, op_name, ``deduplicated_name`` and ``scheduling_name``; per
computation a digest of its body without names and metadata, which identical fused
computations share.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# Fusions that run a library (cuDNN, cuBLAS through a custom fusion) rather than a kernel
# of their own name.
LIBRARY_FUSION = re.compile(r'"kind"\s*:\s*"(__cudnn\$\w+|__custom_fusion|dynamic_address_computation)"')
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.*?)\s(?P<op>[a-z][\w\-]*)\(")
_ATTRS = {
    "op_name": re.compile(r'\bop_name="((?:[^"\\]|\\.)*)"'),
    "deduplicated_name": re.compile(r'\bdeduplicated_name="([^"]*)"'),
    "scheduling_name": re.compile(r'\bscheduling_name="([^"]*)"'),
    "fusion_kind": re.compile(r"\bkind=(k\w+)"),
    "custom_call_target": re.compile(r'\bcustom_call_target="([^"]*)"'),
}
_CALLS = re.compile(r"\b(?:calls|to_apply|body|condition|branch_computations)=\{?([%\w.\-, ]+)\}?")

@dataclass(frozen=True)
class Instruction:
    """One HLO instruction as the optimized text prints it."""

    name: str
    opcode: str
    op_name: str | None = None
    fusion_kind: str | None = None  # kLoop, kInput, kOutput, kCustom
    custom_call_target: str | None = None
    calls: tuple[str, ...] = ()  # computations it calls (fused, applied, wrapped)
    deduplicated_name: str | None = None
    scheduling_name: str | None = None
    library: bool = False  # a fusion that runs a library's kernels (cuDNN...)


@dataclass
class HloModule:
    name: str
    scheduled: bool
    entry: str
    computations: dict[str, list[Instruction]]  # in printed (for a scheduled module: execution) order
    bodies: dict[str, str]  # per computation, a digest of its text without names and metadata


def parse_hlo(text: str) -> HloModule:
    """The computations and instructions of an HLO module's text (``compiled.as_text()``)."""
    header = re.search(r"^HloModule\s+([\w.\-]+)(.*)$", text, re.MULTILINE)
    if header is None:
        raise ValueError("not HLO text: no `HloModule` line; pass XLA's optimized HLO "
                         "(`jitted.lower(...).compile().as_text()`)")
    computations: dict[str, list[Instruction]] = {}
    bodies: dict[str, str] = {}
    entry, current, lines = None, None, []
    for line in text.splitlines():
        if current is None:
            if m := _COMPUTATION.match(line):
                current, lines = m.group(2), []
                computations.setdefault(current, [])
                entry = current if m.group(1) else entry
            continue
        if line.strip() == "}":
            bodies[current] = _body_digest(lines, bodies)
            current = None
        elif m := _INSTRUCTION.match(line):
            computations[current].append(_instruction(m.group("name"), m.group("op"), line[m.end():]))
            lines.append(line)
    if entry is None:
        raise ValueError(f"HLO module {header.group(1)}: no ENTRY computation")
    return HloModule(header.group(1), "is_scheduled=true" in header.group(2), entry, computations, bodies)


def _body_digest(lines: list[str], bodies: Mapping[str, str]) -> str:
    """What identical computations share: their instructions with metadata dropped, local
    names as positions and called computations as their own digests."""
    local: dict[str, str] = {}

    def name(m: re.Match) -> str:
        return local.get(m.group(1)) or bodies.get(m.group(1)) or m.group(0)

    out = []
    for line in lines:
        line = line.split(", metadata=")[0]
        local[_INSTRUCTION.match(line).group("name")] = f"%{len(local)}"
        out.append(re.sub(r"%([\w.\-]+)", name, line.replace("ROOT ", "")))
    return hashlib.blake2b("\n".join(out).encode(), digest_size=8).hexdigest()


def _instruction(name: str, opcode: str, rest: str) -> Instruction:
    found = {key: (m.group(1) if (m := rx.search(rest)) else None) for key, rx in _ATTRS.items()}
    if found["op_name"] is not None:
        found["op_name"] = found["op_name"].replace('\\"', '"')
    calls = tuple(c.strip().lstrip("%") for m in _CALLS.finditer(rest) for c in m.group(1).split(",") if c.strip())
    return Instruction(name, opcode, calls=calls, library=bool(opcode == "fusion" and LIBRARY_FUSION.search(rest)),
                       **found)


def hlo_dir(path: str | Path) -> Path:
    """The folder of optimized HLO beside a result or profile: ``X.hlo`` for ``X.json``,
    ``X.harness.json``, ``X.nsys-rep`` or ``X.sqlite.gz``."""
    return Path(path).with_name(Path(path).name.split(".")[0] + ".hlo")


def read_hlo_dir(directory: str | Path) -> dict[str, HloModule]:
    """Every ``<phase>.txt`` of an HLO folder written by the JAX session, parsed, by phase."""
    files = sorted(Path(directory).glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"{directory}: no optimized HLO (<phase>.txt); record the run with "
                                "`harness.run --backend jax --layer-ranges`")
    return {f.stem: parse_hlo(f.read_text()) for f in files}
