"""XLA's memory analysis of JAX's programs (`JaxSession.memory_analysis`, `memory_model --compiled`),
set against the byte counts of the arrays the programs take and return."""

from __future__ import annotations

import numpy as np
import pytest

from harness import memory_model
from harness.config import get_config
from harness.timing.tokens import make_tokens

jax = pytest.importorskip("jax")


def _nbytes(tree) -> int:
    return int(sum(np.prod(a.shape) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree)))


def test_programs_take_and_return_the_bytes_of_their_arrays() -> None:
    from harness.backends.jax.session import JaxSession

    config = get_config("tiny")
    s = JaxSession(config, make_tokens(config.vocab_size, 2, 16, 0), device="cpu", dtype="fp32", seed=0)
    sizes = s.memory_analysis()
    assert set(sizes) == {"forward", "backward", "optimizer", "fused_step"}
    params, opt, batch = _nbytes(s.state), _nbytes(s.opt_state), _nbytes((s.inputs, s.targets))
    # The fused step takes the weights, AdamW's state and the batch, and returns the first two
    # and the loss; the split forward returns the loss and the residuals jax.vjp keeps.
    assert sizes["fused_step"]["argument"] == params + opt + batch
    residuals = _nbytes(jax.eval_shape(s._fwd, s.state, s.inputs, s.targets))
    assert residuals <= sizes["forward"]["output"] <= residuals * 1.01  # buffers padded to their alignment
    assert sizes["optimizer"]["argument"] == 2 * params + opt  # weights, AdamW's state, gradients
    for phase in sizes.values():
        assert phase["peak"] >= max(phase["argument"], phase["output"])


def test_a_peak_counts_the_programs_temporaries() -> None:
    """At this batch the fused step's temporaries (its activations) outweigh its weights and
    AdamW's state; XLA's CPU backend reports as the peak about its arguments and outputs
    alone, so each program's peak is the upper bound, marked as such."""
    from harness.backends.jax.session import JaxSession

    config = get_config("tiny")
    s = JaxSession(config, make_tokens(config.vocab_size, 16, 128, 0), device="cpu", dtype="fp32", seed=0)
    sizes = s.memory_analysis()
    fused = sizes["fused_step"]
    assert fused["temp"] > fused["argument"] + fused["output"]
    for phase in sizes.values():
        assert phase["peak_bound"] == 1
        assert phase["peak"] == phase["argument"] + phase["output"] + phase["temp"] - phase["alias"]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_swiglu_hands_its_backward_only_its_matmul_output(dtype) -> None:
    """Of the [B, T, d_ff]-wide arrays, the split step's forward keeps one per layer for the
    backward: the product of x and the stacked w1 and w3 ([B, T, 2 d_ff]), from which the
    backward recomputes silu and the gate product; plain autodiff keeps six (silu's
    intermediates, the product)."""
    from harness.backends.jax.session import JaxSession

    config = get_config("tiny")
    s = JaxSession(config, make_tokens(config.vocab_size, 2, 16, 0), device="cpu", dtype=dtype, seed=0)
    residuals = jax.tree.leaves(jax.eval_shape(s._fwd, s.state, s.inputs, s.targets)[1])
    wide = [a for a in residuals if tuple(a.shape[:2]) == (2, 16) and a.shape[-1] in (config.d_ff, 2 * config.d_ff)]
    assert [tuple(a.shape) for a in wide] == [(2, 16, 2 * config.d_ff)] * config.num_layers
    assert all(a.dtype == (jax.numpy.bfloat16 if dtype == "bf16" else jax.numpy.float32) for a in wide)


def test_compiled_table_answers_first_and_refuses_several_sizes(capsys) -> None:
    assert memory_model.main(["--model", "tiny", "--ctx", "16", "--batch", "2", "--compiled", "--device", "cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("the split step's forward hands its backward ")
    assert sum(line.startswith("| split step") or line.startswith("| fused step") for line in out) == 4
    assert out[1].endswith(" GiB") and "the fused step peaks at no more than " in out[1]
    assert out[-1].startswith("every program's peak: arguments + outputs + temporaries - aliased, an upper bound")
    assert memory_model.main(["--model", "tiny", "--ctx", "16,32", "--compiled"]) == 2
    assert capsys.readouterr().err.strip() == "error: --compiled: compiles one step; name one --model and one --ctx"
    # Options that only one of the two modes reads are refused, not silently dropped.
    assert memory_model.main(["--model", "tiny", "--ctx", "16", "--compiled", "--device-memory-gb", "80"]) == 2
    assert capsys.readouterr().err.startswith("error: --device-memory-gb: tests the prediction, not --compiled")
    assert memory_model.main(["--model", "tiny", "--ctx", "16", "--device", "cpu"]) == 2
    assert capsys.readouterr().err.startswith("error: --device cpu: picks where --compiled compiles")
