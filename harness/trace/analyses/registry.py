"""The analyses of a profile: each a function over a `Profile`, registered once, that the
report, the comparison and the diff all run through `run_analyses`.

An analysis is ``@analysis("name")`` over ``f(profile, context) -> result``: `context`
(`Context`) holds what the column's other work already found (its breakdown, the kernels
given to ranges, the `harness.run` metadata, the options); the result is a dataclass (or a
dict) of the column's figures, or None where the analysis does not apply to this profile.
`discover` imports every module of this package, so a new analysis is one new module here:
`harness.trace.analyses.ranks.report_inputs` runs it on every column, `harness.report`
writes its figures to ``<name>.json`` and a table in kernels.md (`harness.reports.analyses`),
`harness.compare` keeps them in summary.json and `harness.diff` in diff.json.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.common.plugins import import_package
from harness.trace.profile import Profile


@dataclass(frozen=True)
class Context:
    """What an analysis may use beside the profile: the column's breakdown
    (`harness.trace.analyses.breakdown.Breakdown`), its kernels given to ranges
    (`harness.trace.analyses.selection.Selection`; None: the profile has no ranges), its
    `harness.run` metadata, the GPU activities to count (`scope`, "all" or "hta") and whether
    the column is one rank of a set (`rank`)."""

    breakdown: Any = None
    selection: Any = None
    meta: Mapping = field(default_factory=dict)
    scope: str = "all"
    rank: bool = False


@dataclass(frozen=True)
class Analysis:
    """One registered analysis: its name (the file and key its figures go under), the
    heading of its table and the function."""

    name: str
    title: str
    run: Callable[[Profile, Context], Any]


_ANALYSES: dict[str, Analysis] = {}


def analysis(name: str, title: str | None = None) -> Callable[[Callable], Callable]:
    """Register the decorated ``f(profile, context) -> result | None`` as the analysis
    `name` (a name registered again is replaced: a reloaded module is the same analysis)."""
    def register(run: Callable[[Profile, Context], Any]) -> Callable[[Profile, Context], Any]:
        _ANALYSES[name] = Analysis(name, title or name.replace("_", " ").capitalize(), run)
        return run
    return register


def unregister(name: str) -> None:
    """Drop the analysis `name` (a test's planted one)."""
    _ANALYSES.pop(name, None)


def discover() -> dict[str, Analysis]:
    """Every analysis of this package, by name, in registration order: importing each module
    registers what it defines (modules already imported are not read again)."""
    import_package(__package__)
    return dict(_ANALYSES)


def run_analyses(profile: Profile, context: Context) -> dict[str, Any]:
    """Every registered analysis of `profile`, by name; those that do not apply (None) are left out."""
    out = {}
    for name, a in discover().items():
        if (result := a.run(profile, context)) is not None:
            out[name] = result
    return out


def jsonable(result: Any) -> Any:
    """A result as JSON takes it: a dataclass as its fields' dict."""
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return dataclasses.asdict(result)
    return result
