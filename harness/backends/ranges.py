"""Phase ranges: NVTX for Nsight Systems, plus the framework profiler's own annotation.

Ranges go to NVTX's default domain through NVIDIA's `nvtx` package for both backends.
(JAX's `TraceAnnotation` writes to XLA's "TSL" NVTX domain, which nsys's importer
mishandles, dropping every kernel record; nsys runs of JAX exclude that domain.)
When a framework profiler is recording instead of nsys, `use_framework_annotations`
makes each range also a `torch.profiler.record_function` or a JAX `TraceAnnotation`,
so the same analysis finds the same phase names.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import nvtx

from harness.common.layer_names import LAYER_RANGE_PREFIX, canonical_layer

_framework_annotation: Callable[[str], contextlib.AbstractContextManager] | None = None


def use_framework_annotations(annotation: Callable[[str], contextlib.AbstractContextManager] | None) -> None:
    """Also open `annotation(name)` (a backend's `Backend.annotation()`: torch.profiler's
    record_function, JAX's TraceAnnotation) inside every range; None turns it off."""
    global _framework_annotation
    _framework_annotation = annotation


@contextlib.contextmanager
def phase_range(name: str) -> Iterator[None]:
    """An NVTX push/pop range named `name` (a no-op when no profiler is attached)."""
    nvtx.push_range(name)
    try:
        if _framework_annotation is None:
            yield
        else:
            with _framework_annotation(name):
                yield
    finally:
        nvtx.pop_range()


_BLOCK = re.compile(r"layers\.\d+")

ATTENTION_STEPS = (("scores", "attn_scores"), ("softmax", "attn_softmax"), ("values", "attn_values"))


def annotate_attention(attention_cls: type, sync: Callable[[object], None]) -> None:
    """Wrap the naive attention's three steps (methods `scores`, `softmax`, `values` of
    `attention_cls`) in NVTX ranges `attn_scores`, `attn_softmax`, `attn_values`, each
    ended by `sync(result)` so the range covers its kernels. The syncs serialize the
    forward pass: such a run attributes time, it does not measure speed."""
    for method, range_name in ATTENTION_STEPS:
        original = getattr(attention_cls, method)

        def wrapped(self, *args, _original=original, _name=range_name):
            with phase_range(_name):
                out = _original(self, *args)
                sync(out)
            return out

        setattr(attention_cls, method, wrapped)


def layer_paths(module_names: Iterable[str]) -> list[str]:
    """The module paths that get a layer range: each block (`layers.3`) and each module
    whose path is a canonical layer name (`harness.trace.analyses.layers`)."""
    return [n for n in module_names if canonical_layer(n) == n or _BLOCK.fullmatch(n)]


class _NodeRanges:
    """The pre-hook of one autograd node: first closes the ranges of the modules whose
    backward ends there (each a one-element flag shared by the nodes of the module's
    inputs: the first of them to run closes it), then opens those whose backward starts
    there, outer first, arming the parameter count of a module that closes on its
    parameters."""

    __slots__ = ("closes", "opens")

    def __init__(self) -> None:
        self.closes: list[list[bool]] = []
        self.opens: list[tuple[str, dict | None]] = []

    def __call__(self, *_grads) -> None:
        for still_open in self.closes:
            if still_open[0]:
                still_open[0] = False
                nvtx.pop_range()
        for text, state in self.opens:
            nvtx.push_range(text)
            if state is not None:
                state["params_left"] = len(state["params"])


_NODE_RANGES = "_layer_node_ranges"  # the attribute of an activation tensor that holds its node's _NodeRanges


def _node_ranges(t) -> _NodeRanges:
    """The `_NodeRanges` of the node that made tensor `t`, registered on first use."""
    hook = getattr(t, _NODE_RANGES, None)
    if hook is None:
        hook = _NodeRanges()
        t.grad_fn.register_prehook(hook)
        setattr(t, _NODE_RANGES, hook)
    return hook


def install_layer_ranges(modules: Mapping[str, Any]) -> list:
    """NVTX ranges `layer:<path>` around each module of `modules` (path -> torch module),
    in the forward and in the backward; returns the hook handles (`.remove()` each to take
    the ranges off again; the list grows where a hook is registered on first use). No
    synchronization: kernels are attributed to the ranges by their launch
    (`harness.trace.analyses.layers`).

    Forward: a forward pre-hook pushes, a forward hook pops, on the calling thread.

    Backward: pre-hooks on the autograd nodes the forward made anyway, registered by the
    forward hook, so they run on the thread that runs the backward (autograd's device
    thread on a GPU) and add no node to the graph. A module's range opens before the node
    that made its output, the first of its backward to run, and closes before the first
    of the nodes that made its inputs runs. The engine runs a node only once every
    gradient it needs is in, and of the nodes ready on a thread, the one made last in the
    forward first; the module's nodes were all made after its inputs', so all of them run
    between the two, and the ranges nest as the modules do. One hook per node does both:
    where a module's input is another's output, the reader's range closes before the
    maker's opens; where a module returns its child's output, the outer range opens first.
    The summing of an input's gradients (a residual connection's share with the module's)
    runs just before the node, inside the reading module's range.

    Where no input of a module is an activation that needs a gradient (the embedding reads
    integer tokens), the range closes instead when autograd has accumulated the gradient
    of the module's last parameter (`register_post_accumulate_grad_hook`), the last step
    of its backward. A module with neither, or whose output is not a tensor of its own
    making (a tuple, its input), gets forward ranges only.

    `register_full_backward_{pre_,}hook` would give the same order, but wraps every hooked
    module's inputs and outputs in a Python autograd function on every forward, which costs
    a launch-bound eager step tens of percent; here a module costs two forward hooks and
    about one Python call in the backward."""
    import torch

    handles: list = []
    for path, module in modules.items():
        text = LAYER_RANGE_PREFIX + path
        state = {"params": None, "params_left": 0}

        def accumulated(param, _state=state):
            if _state["params_left"]:
                _state["params_left"] -= 1
                if not _state["params_left"]:
                    nvtx.pop_range()

        def forward_post(mod, args, out, _text=text, _state=state, _accumulated=accumulated):
            nvtx.pop_range()
            node = out.grad_fn if isinstance(out, torch.Tensor) else None
            if node is None:
                return
            inputs = {id(a): a for a in args if isinstance(a, torch.Tensor) and a.grad_fn is not None}
            if any(a is out or a.grad_fn is node for a in inputs.values()):
                return
            if inputs:
                still_open = [True]
                for a in inputs.values():
                    _node_ranges(a).closes.append(still_open)
                _node_ranges(out).opens.insert(0, (_text, None))
                return
            if _state["params"] is None:  # once: these hooks stay on the parameters
                _state["params"] = [p for p in mod.parameters() if p.requires_grad]
                handles.extend(p.register_post_accumulate_grad_hook(_accumulated) for p in _state["params"])
            if _state["params"]:
                _node_ranges(out).opens.insert(0, (_text, _state))

        handles.extend([module.register_forward_pre_hook(lambda mod, args, _text=text: nvtx.push_range(_text)),
                        module.register_forward_hook(forward_post)])
    return handles
