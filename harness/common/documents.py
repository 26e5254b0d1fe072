"""The documents the harness writes, typed: every schema id once, a frozen record per kind.

A run (`harness.run`'s result), a comparison's summary.json, a diff's diff.json, a sweep's
sweep.json and each line of its cells.jsonl. Each record has `SCHEMA`, `from_dict` (which
refuses a document of another or no schema in one line, `DocumentError`) and `to_dict`,
which gives back the document it was read from, key order included. The fields consumers
branch on (status, error, options, a comparison's runs...) are typed; a document's
open-ended body (per-phase timing tables, environment...) stays a mapping, `extra`.

`Status` is the one vocabulary of how a run or a sweep cell ended.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

RUN_SCHEMA = "harness.run/1"
COMPARE_SCHEMA = "harness.compare/1"
DIFF_SCHEMA = "harness.diff/1"
SWEEP_SCHEMA = "harness.sweep/1"
SWEEP_CELL_SCHEMA = "harness.sweep.cell/1"
BENCH_OPTIMIZER_SCHEMA = "harness.bench_optimizer/1"


class Status(enum.StrEnum):
    """How a run or a sweep cell ended. A run writes ok, oom or error (`interrupted`: a
    comparison stopped before the run finished); a sweep cell whose process left no run
    document is crashed or timeout, and one not run yet is "not run"."""

    OK = "ok"
    OOM = "oom"
    ERROR = "error"
    INTERRUPTED = "interrupted"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    NOT_RUN = "not run"


# The statuses of a cell that ran and failed (a sweep's "failed" list).
FAILED = (Status.OOM, Status.ERROR, Status.CRASHED, Status.TIMEOUT)


class DocumentError(ValueError):
    """A document of another kind than expected; the message is one line naming both."""


def family(schema: str) -> str:
    """The schema id without its version: "harness.compare/" of "harness.compare/1"."""
    return schema.partition("/")[0] + "/"


def schema_of(doc: object) -> str:
    """The schema id a JSON document names ("" where it is no object or names none)."""
    return str(doc.get("schema", "")) if isinstance(doc, Mapping) else ""


def is_document(doc: object, schema: str) -> bool:
    """Whether `doc` is of the kind of `schema`, in any version."""
    return schema_of(doc).startswith(family(schema))


def status(value: object, source: str = "document") -> Status:
    """The `Status` a document records; a value outside the vocabulary is a `DocumentError`."""
    try:
        return Status(value)
    except ValueError:
        raise DocumentError(f"{source}: status {value!r} is none of "
                            f"{', '.join(s.value for s in Status)}") from None


@dataclass(frozen=True, kw_only=True)
class _Document:
    """What every record shares: the document's other fields (`extra`) and the order of
    its keys, so that `to_dict` writes the document it was read from."""

    SCHEMA: ClassVar[str]
    TYPED: ClassVar[tuple[str, ...]]
    REQUIRED: ClassVar[tuple[str, ...]] = ()  # the keys a document of the kind always has
    extra: Mapping[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def _check(cls, doc: object, source: str, need_schema: bool = True) -> Mapping:
        if not isinstance(doc, Mapping):
            raise DocumentError(f"{source}: not a JSON object, expected a {cls.SCHEMA} document")
        if ("schema" in doc or need_schema) and doc.get("schema") != cls.SCHEMA:
            found = f"schema {doc['schema']!r}" if "schema" in doc else "no schema"
            raise DocumentError(f"{source}: {found}, expected a {cls.SCHEMA} document")
        if missing := [k for k in cls.REQUIRED if k not in doc]:
            raise DocumentError(f"{source}: a {cls.SCHEMA} document without {missing[0]!r}")
        return doc

    @classmethod
    def _split(cls, doc: Mapping) -> dict[str, Any]:
        """The keyword arguments of the untyped part: `extra` and `keys`."""
        return {"extra": {k: v for k, v in doc.items() if k != "schema" and k not in cls.TYPED},
                "keys": tuple(doc)}

    def _typed(self) -> dict[str, Any]:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The JSON document: the keys of the document read, in its order, or (a new record)
        schema, the typed fields and the rest."""
        typed = {"schema": self.SCHEMA, **self._typed()}
        order = self.keys or (*typed, *self.extra)
        return {k: typed[k] if k in typed else self.extra[k] for k in order}

    def __getitem__(self, key: str) -> Any:
        """A field by its key: a typed one as its attribute (a run's `error` is a `Failure`),
        any other from the open-ended body; so code that reads a document's body by key
        (`run["phases"]`, `run.get("env")`) reads the record alike."""
        if key == "schema":
            return self.SCHEMA
        return getattr(self, key) if key in self.TYPED else self.extra[key]

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


@dataclass(frozen=True)
class Failure:
    """Where a run failed and the one line saying why."""

    phase: str | None
    message: str

    @classmethod
    def from_dict(cls, error: object, source: str = "run document") -> Failure | None:
        if error is None:
            return None
        if not isinstance(error, Mapping) or set(error) != {"phase", "message"}:
            raise DocumentError(f"{source}: its error is not a {{phase, message}} object")
        return cls(error["phase"], error["message"])

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "message": self.message}


@dataclass(frozen=True, kw_only=True)
class RunDocument(_Document):
    """One backend's run (`harness.timing.runner.run`): its status, error and options
    typed; phases, first step, environment... in `extra`."""

    SCHEMA: ClassVar[str] = RUN_SCHEMA
    TYPED: ClassVar[tuple[str, ...]] = ("status", "error", "options")
    REQUIRED: ClassVar[tuple[str, ...]] = ("status",)
    status: Status
    error: Failure | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, doc: object, source: str = "run document", need_schema: bool = True) -> RunDocument:
        """`need_schema=False`: a comparison's record of a run that left no document (its
        process failed or was stopped) carries no schema."""
        doc = cls._check(doc, source, need_schema)
        return cls(status=status(doc["status"], source), error=Failure.from_dict(doc.get("error"), source),
                   options=doc.get("options") or {}, **cls._split(doc))

    def _typed(self) -> dict[str, Any]:
        return {"status": self.status.value, "error": self.error and self.error.to_dict(), "options": self.options}

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def backend(self) -> str | None:
        return self.options.get("backend")

    @property
    def message(self) -> str:
        """Why the run failed ("?" where it recorded no reason)."""
        return self.error.message if self.error else "?"

    @property
    def phases(self) -> Mapping[str, Any]:
        """Phase name -> its timing record (empty for a failed run)."""
        return self.extra.get("phases") or {}


def whole_step(phases: Mapping[str, Any]) -> str:
    """The phase that times a whole training step: JAX's fused step where `phases` (a run's, or
    a profile's, keyed by phase name) hold one, else the split step."""
    return "fused_step" if "fused_step" in phases else "step"


@dataclass(frozen=True, kw_only=True)
class CompareDocument(_Document):
    """A comparison's summary.json: whether it passed, its options and one run per backend."""

    SCHEMA: ClassVar[str] = COMPARE_SCHEMA
    TYPED: ClassVar[tuple[str, ...]] = ("ok", "options", "runs")
    ok: bool | None
    options: Mapping[str, Any] = field(default_factory=dict)
    runs: Mapping[str, RunDocument] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, doc: object, source: str = "summary.json") -> CompareDocument:
        doc = cls._check(doc, source)
        return cls(ok=doc.get("ok"), options=doc.get("options") or {}, runs=runs_of(doc, f"{source}: runs"),
                   **cls._split(doc))

    def _typed(self) -> dict[str, Any]:
        return {"ok": self.ok, "options": self.options, "runs": {b: r.to_dict() for b, r in self.runs.items()}}


def run_records(runs: Mapping[str, Mapping], source: str = "runs") -> dict[str, RunDocument]:
    """Label -> typed run, of run documents the harness holds in memory (a comparison's
    record of a run that left no document has no schema; neither need these)."""
    return {b: RunDocument.from_dict(r, f"{source}.{b}", need_schema=False) for b, r in runs.items()}


def runs_of(summary: Mapping, source: str = "summary.json: runs") -> dict[str, RunDocument]:
    """The runs of a comparison's summary, label -> typed run (`run_records`)."""
    return run_records(summary.get("runs") or {}, source)


@dataclass(frozen=True, kw_only=True)
class DiffDocument(_Document):
    """diff.json: the two runs' labels, the fields that must match, the gap per phase."""

    SCHEMA: ClassVar[str] = DIFF_SCHEMA
    TYPED: ClassVar[tuple[str, ...]] = ("a_label", "b_label", "fields", "phases", "notes")
    REQUIRED: ClassVar[tuple[str, ...]] = ("a_label", "b_label")
    a_label: str
    b_label: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    phases: tuple[Mapping[str, Any], ...] = ()
    notes: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, doc: object, source: str = "diff.json") -> DiffDocument:
        doc = cls._check(doc, source)
        return cls(a_label=doc["a_label"], b_label=doc["b_label"], fields=doc.get("fields") or {},
                   phases=tuple(doc.get("phases") or ()), notes=tuple(doc.get("notes") or ()), **cls._split(doc))

    def _typed(self) -> dict[str, Any]:
        return {"a_label": self.a_label, "b_label": self.b_label, "fields": self.fields,
                "phases": list(self.phases), "notes": list(self.notes)}


@dataclass(frozen=True, kw_only=True)
class SweepDocument(_Document):
    """sweep.json: the options every cell shares, the axes of the grid."""

    SCHEMA: ClassVar[str] = SWEEP_SCHEMA
    TYPED: ClassVar[tuple[str, ...]] = ("options", "axes", "warmup_study")
    REQUIRED: ClassVar[tuple[str, ...]] = ("options", "axes")
    options: Mapping[str, Any]
    axes: Mapping[str, Any]
    warmup_study: bool = False

    @classmethod
    def from_dict(cls, doc: object, source: str = "sweep.json") -> SweepDocument:
        doc = cls._check(doc, source)
        return cls(options=doc["options"], axes=doc["axes"], warmup_study=bool(doc.get("warmup_study")),
                   **cls._split(doc))

    def _typed(self) -> dict[str, Any]:
        return {"options": self.options, "axes": self.axes, "warmup_study": self.warmup_study}


@dataclass(frozen=True, kw_only=True)
class SweepCell(_Document):
    """One line of cells.jsonl: a cell's key and axes, how it ended and its run document
    (`result`, None where the process left none)."""

    SCHEMA: ClassVar[str] = SWEEP_CELL_SCHEMA
    TYPED: ClassVar[tuple[str, ...]] = ("key", "cell", "status", "reason", "exit_code", "wall_s", "log", "profile",
                                        "gpu", "result")
    REQUIRED: ClassVar[tuple[str, ...]] = ("key", "cell", "status")
    key: str
    cell: Mapping[str, Any]
    status: Status
    reason: str | None = None
    exit_code: int | None = None
    wall_s: float | None = None
    log: str | None = None
    profile: str | None = None
    gpu: str | None = None
    result: RunDocument | None = None

    @classmethod
    def from_dict(cls, doc: object, source: str = "cells.jsonl") -> SweepCell:
        doc = cls._check(doc, source)
        result = doc.get("result")
        plain = {k: doc.get(k) for k in ("reason", "exit_code", "wall_s", "log", "profile", "gpu")}
        return cls(key=doc["key"], cell=doc["cell"], status=status(doc["status"], f"{source}: {doc['key']}"),
                   result=None if result is None else RunDocument.from_dict(result, f"{source}: {doc['key']}"),
                   **plain, **cls._split(doc))

    def _typed(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name in self.TYPED}
        return out | {"status": self.status.value, "result": self.result and self.result.to_dict()}
