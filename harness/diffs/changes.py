"""What the two sides of a diff were run with, where they differ, for `Diff.changes`: the run's
options, the settings made through the environment, the source tree, and the library and driver
versions and the GPU's limits each `harness.run` document records. A before/after compare is
read as "this change cost that much"; the diff's answer names the change, so that a gap between
runs that differ in more than the change (another tree, another XLA flag, another driver) is not
read as the change's."""

from __future__ import annotations

from collections.abc import Sequence

from harness.diffs.inputs import Run

# Fields of a run's environment record that say nothing of how it ran, or that other fields
# cover: the rest (library and driver versions, the GPU's power limit and maximum clock) count.
NOT_COMPARED = frozenset({"command", "host_platform", "device", "gpu_name", "gpu_memory", "git_commit",
                          "source_sha256", "diff_sha256", "dirty_files", "settings"})
UNSET = "unset"
SOURCE_SEP = "\0"


def _source(env: dict) -> str | None:
    """The tree as its commit names it (with -dirty where it had uncommitted changes), and the
    digest of the source that ran, joined by SOURCE_SEP (`_shown` writes them out)."""
    digest = env.get("source_sha256")
    if digest is None:
        return None
    commit = env.get("git_commit")
    label = "no commit" if not commit else commit[:7] + ("-dirty" if commit.endswith("-dirty") else "")
    return f"{label}{SOURCE_SEP}{digest[:7]}"


def _shown(values: list[str], other: list[str]) -> list[str]:
    """Source values as the answer writes them: the commit alone where the commits tell the
    sides' trees apart; with the digest too where a tree was dirty, a side has no commit, or
    one commit stands for two trees (metadata older than the copy that ran)."""
    labels = {v.split(SOURCE_SEP)[0] for v in (*values, *other)}
    plain = len(labels) == len({*values, *other}) and not any(x == "no commit" or x.endswith("-dirty")
                                                              for x in labels)
    return [v.split(SOURCE_SEP)[0] if plain or SOURCE_SEP not in v else v.replace(SOURCE_SEP, " (source ") + ")"
            for v in values]


def _record(doc: dict) -> dict[str, str]:
    """One run's comparable record: label -> value, every value a string."""
    env, out = doc.get("env") or {}, {}
    for name, value in sorted((doc.get("options") or {}).items()):
        out[f"--{name.replace('_', '-')}"] = str(value)
    for name, value in sorted((env.get("settings") or {}).items()):
        if "CACHE_DIR" not in name:  # where compiled code is cached, not what runs
            out[name] = str(value)
    if (source := _source(env)) is not None:
        out["source tree"] = source
    for name, value in sorted(env.items()):
        if name in NOT_COMPARED or value is None:
            continue
        for key, item in (sorted(value.items()) if isinstance(value, dict) else [("", value)]):
            out[f"{name}.{key}" if key else name] = str(item)  # a table (compiler options) by its entries
    return out


def _kind(label: str, settings: set[str]) -> int:
    """Options first, then settings, the tree and the environment, as `_record` lists them."""
    return 0 if label.startswith("--") else 1 if label in settings else 2 if label == "source tree" else 3


def _side(values: list[str]) -> str:
    distinct = list(dict.fromkeys(values))
    return distinct[0] if len(distinct) == 1 else " / ".join(distinct)


def run_changes(a: Sequence[Run], b: Sequence[Run]) -> list[dict[str, str]] | None:
    """Each field whose values differ between A's runs and B's runs, as {"what", "a", "b"}
    (a side whose runs disagree among themselves lists its values joined by " / "). A setting
    one side made and the other did not reads "unset" on the other side; a version (or other
    field of the environment) only where both sides record it. None where a run
    has no `harness.run` document (a bare profile records none of this)."""
    if not a or not b or any(r.doc is None for r in (*a, *b)):
        return None
    records = [[_record(r.doc) for r in runs] for runs in (a, b)]
    settings = {name for r in (*a, *b) for name in ((r.doc.get("env") or {}).get("settings") or {})}
    labels = sorted(dict.fromkeys(k for side in records for rec in side for k in rec),
                    key=lambda label: _kind(label, settings))
    out = []
    for label in labels:
        values = [[rec.get(label, UNSET) for rec in side] for side in records]
        if _kind(label, settings) == 3 and UNSET in {*values[0], *values[1]}:
            continue  # a library one side does not load (another framework's) is no change
        if set(values[0]) != set(values[1]):
            if label == "source tree":
                values = [_shown(values[0], values[1]), _shown(values[1], values[0])]
            out.append({"what": label, "a": _side(values[0]), "b": _side(values[1])})
    return out


def changes_sentence(changes: list[dict[str, str]] | None) -> str | None:
    """One line for the diff's answer: what A and B were run with differently, or that they
    record the same (then the gap is between runs of one configuration); None without the
    documents to tell."""
    if changes is None:
        return None
    if changes:
        return "A and B differ in " + "; ".join(f"{c['what']} {c['a']} -> {c['b']}" for c in changes) + "."
    return ("A and B record the same options, settings, source tree and versions: the gap is between runs of "
            "one configuration.")
