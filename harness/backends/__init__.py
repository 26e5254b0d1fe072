"""The backends: one `Backend` record per name, the one place that knows what each can do.

Where to add a backend: a module with a session class (the `Session` protocol of
`harness.backends.session`) and a `Backend` record whose `make_session` builds it, passed
to `register`. The built-in families live in `harness.backends.torch` (eager, compiled,
compiled with CUDA graphs) and `harness.backends.jax`; they load on the first lookup.
A backend registered at run time with a `source` ("<module or file.py>:<attribute>")
is exported through the environment variable `PLUGINS_ENV` (comma-separated), so the `harness.run` and
`harness.parity` subprocesses of a comparison or a sweep load it too.

The rest of the harness asks the record (`get(name).fused_step`, `.one_process`, ...),
never the name.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from harness.common.errors import UsageError

BUILTIN_MODULES = ("harness.backends.torch", "harness.backends.jax")
PLUGINS_ENV = "HARNESS_BACKEND_PLUGINS"


@dataclasses.dataclass(frozen=True)
class Backend:
    """What the harness needs to know about one backend.

    The callables import their framework when called, so that listing the backends (the
    CLI's choices, `compare --render`) imports neither torch nor JAX."""

    name: str
    # (opts, config, tokens) -> Session: the model on opts.device from the shared seeded
    # weights, one token batch (the full data-parallel batch; a rank takes its rows).
    make_session: Callable[..., Any]
    precision: Mapping[str, str]  # per dtype, the result document's `precision` text
    attention: tuple[str, ...]  # the attention kernels it runs (harness.config.ATTENTION_CHOICES)
    memory_note: str  # what its phases' peak memory measures
    # (device) -> why it cannot run on `device` here (a sentence naming the fix), or None
    unavailable: Callable[[str], str | None] = lambda device: None
    devices: tuple[str, ...] = ("cuda", "cpu")  # the --device values it is made for (tools' defaults skip others)
    # () -> what is wrong with the environment it reads (a sentence naming the variable and the
    # fix), or None; refused before any work whether the backend is asked for or a default
    environment_problem: Callable[[], str | None] = lambda: None
    stand_in: Mapping[str, str] = dataclasses.field(default_factory=dict)  # asked kernel -> the one it runs
    fused_step: bool = False  # a fused step (one program) timed beside the split one
    # "hooks": NVTX ranges per layer from module hooks (overhead measured); "hlo": named
    # scopes joined to the optimized HLO afterwards; None: no layer ranges (why: `layer_ranges_problem`)
    layer_ranges: str | None = None
    layer_ranges_problem: str = "has no layer ranges"
    # (device) -> a context manager in which naive attention's sub-steps get ranges; None: it cannot
    annotate_attention: Callable[[str], AbstractContextManager] | None = None
    nsys_flags: tuple[str, ...] = ()  # extra `nsys profile` flags
    # data-parallel strategies (harness.config.PARALLEL) -> what each does, in its framework's words
    parallel: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # strategies of `parallel` it refuses to run -> why, in one line naming the fix (their
    # labels stay, for the documents of runs made before the refusal)
    parallel_refused: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # takes the DDP/FSDP2 wrap options (--ddp-bucket-mb, --ddp-static-graph, --grad-comm,
    # --fsdp-reshard-after-forward); a backend without them runs with none and is refused them
    wrap_options: bool = False
    # DDP's bucket_cap_mb when --ddp-bucket-mb is not given (None: DDP's own default, 25 MB)
    ddp_bucket_mb: float | None = None
    one_process: bool = False  # data-parallel: one process drives every device (else one per device)
    profile_file: str = "{name}-trace.json"  # its framework profile's file (or folder) name
    profiler: Callable[[str], AbstractContextManager] | None = None  # (path) -> records a framework profile
    annotation: Callable[[], Callable[[str], AbstractContextManager]] | None = None  # its profiler's range
    compile_events: str | None = None  # the host compile events `EventLog` watches: "jax.monitoring", "dynamo"
    simulated_oom: Callable[[], BaseException] = lambda: MemoryError("out of memory (simulated by --fail-in)")
    reference: bool = False  # the backend the others are compared with (parity, ratios)
    tolerances: Mapping[str, Mapping[str, float]] | None = None  # parity bounds per dtype against the reference
    default: bool = False  # in the tools' default set of backends
    memory_model: bool = False  # harness.memory_model's prediction (eager torch's saved tensors) applies to it
    compile_weight: int = 1  # a sweep cell's rough cost relative to its FLOPs (compilation time)
    compiles: bool = False  # a loop's first step compiles (torch.compile, jax.jit): its progress line says so
    compile_mode: str | None = None  # torch.compile's mode ("default", "reduce-overhead"); None: not torch.compile
    # how reports name the framework it runs on ("torch", "JAX"); "": its own name. A backend of
    # another framework than the reference's is set against it in a sweep's ratio table.
    framework: str = ""
    # under --parallel fsdp, all-gathers every float32 parameter in the forward (and again in the
    # backward unless --fsdp-reshard-after-forward false): FSDP2; the size of its all-gathers is known
    gathers_parameters: bool = False
    # under bf16 on several devices, its compiler sums each matmul weight's gradient across them
    # in bf16 beside float32 sums of the rest: its gradient collectives have no one known size
    bf16_gradient_sums: bool = False
    # the libraries whose versions its run documents record (keys of its session's `versions()`
    # in the document's env): the version lines of the reports
    libraries: tuple[str, ...] = ()

    @property
    def framework_name(self) -> str:
        """How reports name its framework: `framework`, else its own name."""
        return self.framework or self.name


_records: dict[str, Backend] = {}
_sources: dict[str, str] = {}  # name -> where subprocesses find a registered record
_loaded = False


def register(backend: Backend, source: str | None = None) -> None:
    """Add `backend` (replacing one of the same name). `source`, "<module or file.py>:<attribute>"
    naming the record (or a sequence of records), exports it to this process's subprocesses."""
    _load()
    _records[backend.name] = backend
    if source:
        _sources[backend.name] = source
        _set_plugins([*_plugins(), source])


def unregister(name: str) -> None:
    """Remove the backend `name` and its export to subprocesses."""
    _records.pop(name, None)
    source = _sources.pop(name, None)
    _set_plugins([p for p in _plugins() if p != source])


def _plugins() -> list[str]:
    return [p for p in os.environ.get(PLUGINS_ENV, "").split(",") if p]


def _set_plugins(sources: list[str]) -> None:
    if sources:
        os.environ[PLUGINS_ENV] = ",".join(dict.fromkeys(sources))
    else:
        os.environ.pop(PLUGINS_ENV, None)


def _import(source: str) -> list[Backend]:
    """The records that `source` ("<module or file.py>:<attribute>") names; a UsageError
    naming the entry of `PLUGINS_ENV` and what is wrong with it where it names none."""
    where, _, attribute = source.rpartition(":")
    fix = f"fix or remove that entry of {PLUGINS_ENV}"
    if not where or not attribute:
        raise UsageError(f"{PLUGINS_ENV} entry {source!r} is not <module or file.py>:<attribute>; {fix}")
    try:
        if where.endswith(".py"):
            name = f"harness_backend_plugin_{Path(where).stem}"
            module = sys.modules.get(name)
            if module is None:
                if not Path(where).is_file():
                    raise FileNotFoundError(f"no file {where}")
                spec = importlib.util.spec_from_file_location(name, where)
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
        else:
            module = importlib.import_module(where)
        found = getattr(module, attribute)
    except (ImportError, AttributeError, OSError, SyntaxError) as exc:
        raise UsageError(f"{PLUGINS_ENV} entry {source!r}: {type(exc).__name__}: {exc}; {fix}") from exc
    records = [found] if isinstance(found, Backend) else list(found) if isinstance(found, (list, tuple)) else None
    if not records or not all(isinstance(r, Backend) for r in records):
        raise UsageError(f"{PLUGINS_ENV} entry {source!r} names a {type(found).__name__}, not a Backend record "
                         f"or a list of them; {fix}")
    return records


def _load() -> None:
    """Register the built-in families, then the plugins named in `PLUGINS_ENV`, once."""
    global _loaded
    if _loaded:
        return
    _loaded = True  # a plugin may look up a built-in record while it is imported
    for module in BUILTIN_MODULES:
        for backend in importlib.import_module(module).RECORDS:
            _records.setdefault(backend.name, backend)
    try:
        plugins = [backend for source in _plugins() for backend in _import(source)]
    except UsageError:
        _loaded = False  # a bad entry: no plugin loads, and the next lookup says so again
        raise
    for backend in plugins:
        _records[backend.name] = backend


def names() -> tuple[str, ...]:
    """Every registered backend's name, in registration order."""
    _load()
    return tuple(_records)


def get(name: str) -> Backend:
    """The record of `name`; ValueError naming the choices for an unknown one."""
    _load()
    if name not in _records:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(_records)}")
    return _records[name]


def all_backends() -> Iterable[Backend]:
    _load()
    return tuple(_records.values())


def defaults() -> tuple[str, ...]:
    """The backends a tool runs when --backend is not given."""
    return tuple(b.name for b in all_backends() if b.default)


def reference() -> str:
    """The backend every other one is compared with (parity, ratios)."""
    return next(b.name for b in all_backends() if b.reference)


def compared() -> tuple[str, ...]:
    """The backends parity can compare with the reference."""
    return tuple(b.name for b in all_backends() if b.tolerances is not None and not b.reference)


def other_frameworks() -> tuple[str, ...]:
    """The backends of another framework than the reference's (JAX against eager torch): a
    sweep's ratio table sets each against the reference, and parity compares them by default."""
    own = get(reference()).framework_name
    return tuple(b.name for b in all_backends() if b.framework_name != own)


def libraries() -> tuple[str, ...]:
    """Every registered backend's `libraries`, once each, in registration order: torch, jax."""
    return tuple(dict.fromkeys(lib for b in all_backends() for lib in b.libraries))


def backend_attention(name: str, attention: str) -> str:
    """The attention kernel `name` runs when `attention` is asked of every backend (torch
    runs its fused SDPA opposite JAX's Pallas kernel)."""
    backend = get(name)
    return attention if attention in backend.attention else backend.stand_in.get(attention, attention)


def attention_problem(name: str, attention: str) -> str | None:
    """Why `name` cannot run `attention` when asked for it alone, or None."""
    backend = get(name)
    if attention in backend.attention:
        return None
    runs = [b.name for b in all_backends() if attention in b.attention]
    return (f"--attention {attention} is not a kernel of --backend {name} (it runs {', '.join(backend.attention)}); "
            f"{attention} runs on {', '.join(runs) or 'no backend'}")


def attention_problem_of(names: Sequence[str], attention: str) -> str | None:
    """Why `attention` asked of the backends `names` together would run on none of them (each
    runs its stand-in, so a result labelled `attention` would hold no such kernel), or None."""
    if any(attention in get(name).attention for name in names):
        return None
    runs = [b.name for b in all_backends() if attention in b.attention]
    stand_ins = sorted({s for name in names if (s := get(name).stand_in.get(attention)) and s != attention})
    instead = f" (they would run {', '.join(stand_ins)} in its place)" if stand_ins else ""
    other = f", or ask for --attention {stand_ins[0]}" if stand_ins else ""
    return (f"--attention {attention} is no kernel of --backend {','.join(names)}{instead}; include "
            f"{' or '.join(runs) or 'a backend that runs it'} in --backend{other}")


def choose_backends(asked: Sequence[str] | None, default: Sequence[str], device: str, tool: str) -> list[str]:
    """The backends a tool runs: `asked` (a UsageError if one cannot run on `device`), or
    `default` less those that cannot, each skipped one named on stderr with the reason. A
    problem with the environment a backend reads is a UsageError either way."""
    for name in asked if asked is not None else default:
        if problem := get(name).environment_problem():
            raise UsageError(problem)
    for name in asked or ():
        if reason := get(name).unavailable(device):
            raise UsageError(f"--backend {reason}")
    if asked is not None:
        return list(asked)
    chosen = []
    for name in default:
        if reason := get(name).unavailable(device):
            print(f"{tool}: skipping {reason}", file=sys.stderr)
        else:
            chosen.append(name)
    return chosen
