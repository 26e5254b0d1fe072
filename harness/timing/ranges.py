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
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import nvtx

from harness.trace.layers import LAYER_RANGE_PREFIX, canonical_layer

_framework_annotation: Callable[[str], contextlib.AbstractContextManager] | None = None


def use_framework_annotations(backend: str | None) -> None:
    """Also annotate ranges for torch.profiler ("torch") or jax.profiler ("jax"); None turns it off."""
    global _framework_annotation
    if backend is None:
        _framework_annotation = None
    elif backend == "torch":
        import torch

        _framework_annotation = torch.profiler.record_function
    elif backend == "jax":
        import jax

        _framework_annotation = jax.profiler.TraceAnnotation
    else:
        raise ValueError(f"unknown backend {backend!r}; choose torch or jax")


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
    whose path is a canonical layer name (`harness.trace.layers`)."""
    return [n for n in module_names if canonical_layer(n) == n or _BLOCK.fullmatch(n)]


def install_layer_ranges(modules: Mapping[str, Any]) -> list:
    """NVTX ranges `layer:<path>` around each module of `modules` (path -> torch module),
    in the forward and in the backward, from hooks registered on the modules; returns the
    hook handles (`.remove()` each to take the ranges off again). No synchronization:
    kernels are attributed to the ranges by their launch (`harness.trace.layers`).

    Forward: a forward pre-hook pushes, a forward hook pops, on the calling thread.
    Backward: `register_full_backward_pre_hook` pushes and `register_full_backward_hook`
    pops. Both run inside autograd's graph, on the thread that runs the backward
    (autograd's device thread on a GPU), because torch implements them as an identity
    function around the module's outputs (whose backward is the pre-hook: the gradient
    reaching the module) and one around its inputs (the gradient leaving it). The engine
    runs a node only once every gradient it needs is in, so a module's backward nodes run
    between the two, and a module's range closes before a sibling's opens: the ranges nest
    as the modules do. Tensor hooks on outputs and inputs would give the same order, but
    need re-registering on every forward's tensors. Where no input of a module needs a
    gradient (the embedding reads integer tokens), torch calls the full backward hook as
    soon as the output's gradient arrives, before the module's own backward ran; such a
    module's range closes instead when autograd has accumulated the gradient of its last
    parameter (`register_post_accumulate_grad_hook`), the last step of its backward."""
    # The embedding's case above, handled on purpose: torch's warning about it would repeat every step.
    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with "
                                              "respect to module outputs since no inputs require gradients")
    handles = []
    for path, module in modules.items():
        text = LAYER_RANGE_PREFIX + path
        state = {"inputs_need_grad": True, "params_left": 0, "params": 0}
        params = [p for p in module.parameters(recurse=True) if p.requires_grad]
        state["params"] = len(params)

        def forward_pre(mod, args, _text=text, _state=state):
            _state["inputs_need_grad"] = any(getattr(a, "requires_grad", False) for a in args)
            nvtx.push_range(_text)

        def backward_pre(mod, grad_output, _text=text, _state=state):
            _state["params_left"] = 0 if _state["inputs_need_grad"] else _state["params"]
            nvtx.push_range(_text)

        def backward_post(mod, grad_input, grad_output, _state=state):
            if _state["inputs_need_grad"] or not _state["params_left"]:
                nvtx.pop_range()

        def accumulated(param, _state=state):
            if _state["params_left"]:
                _state["params_left"] -= 1
                if not _state["params_left"]:
                    nvtx.pop_range()

        handles += [module.register_forward_pre_hook(forward_pre),
                    module.register_forward_hook(lambda mod, args, out: nvtx.pop_range()),
                    module.register_full_backward_pre_hook(backward_pre),
                    module.register_full_backward_hook(backward_post)]
        handles += [p.register_post_accumulate_grad_hook(accumulated) for p in params]
    return handles
