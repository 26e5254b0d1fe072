"""One training step of jax_impl, split into separately jitted phases the harness can time.

The split step is three real computations: a jitted forward returning the loss and the
`jax.vjp` residuals, a jitted backward applying them, and a jitted AdamW update. The
fused step (value_and_grad and update in one `jit`) is timed beside it, since XLA can
fuse and schedule across the phase boundaries there.

`JaxSession` implements `harness.backends.session.Session`; `harness.backends.jax` holds its record.

Layer attribution (`layer_ranges`) adds nothing to the step: the model's `jax.named_scope`s
are always on and only label the HLO's metadata. What a profile needs to map kernels to
layers is the optimized HLO of each jitted phase, which `write_hlo` writes after the timed
loops (`harness.trace.analyses.hlo_join` joins it to the kernels).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_impl
from harness.backends.jax.convert import torch_to_jax
from harness.backends.jax.flat import FlatLayout
from harness.backends.jax.on_mesh import jit_on
from harness.backends.jax.precision import compute_params, set_matmul_precision, sum_dtypes
from harness.config import ModelConfig

LAYER_METHOD = ("jax.named_scope per block and sub-module (HLO metadata only, always on: the step runs the same "
                "executables); kernels joined to the optimized HLO schedule of each jitted phase, written beside the "
                "result as <name>.hlo/<phase>.txt")


# Under sharded parameters XLA's partitioner emits one all-gather per parameter in the
# forward and the backward, and one reduce-scatter per gradient: hundreds of collectives a
# step for `large`, each paying its launch and a rendezvous of every device. These options
# let XLA merge independent all-gathers into ones of up to 256 MiB (fewer, larger transfers,
# for some memory: a merged all-gather's weights are resident from the first consumer of any
# of them), and reduce-scatters into ones of up to 16 MiB: the last reduce-scatters of the
# backward have no compute left to hide under, so the more gradients they hold, the longer
# each step waits for them before AdamW. The latency-hiding scheduler orders the program so
# that each collective runs under the compute that does not need it.
# Only sharded parameters are compiled with them: the strategy they were measured on.
# A setting the user gives in XLA_FLAGS wins: options given to the compiler would override it.
SHARDED_COMPILER_OPTIONS = {"xla_gpu_all_gather_combine_threshold_bytes": 256 << 20,
                            "xla_gpu_reduce_scatter_combine_threshold_bytes": 16 << 20,
                            "xla_gpu_enable_latency_hiding_scheduler": True}
# On a GPU, XLA's dot merger makes the q, k and v projections one matmul wherever a projection's
# inputs and output come to under its threshold (32 MB): `large` at 4 sequences of 1024 tokens
# per device. The weights are then concatenated on every call, the output sliced into three,
# and in the backward the same again for the weight gradients: copies of the whole activation
# that the three matmuls alone do not make. Above the threshold (batch 8 and up at ctx 1024)
# nothing is merged, so the option changes nothing there.
GPU_COMPILER_OPTIONS = {"xla_gpu_dot_merger_threshold_mb": 0}


def compiler_options(parallel: str, data_parallel: int, platform: str) -> dict[str, int | bool]:
    """The XLA options every jitted program of a session is compiled with, less those that
    $XLA_FLAGS sets: on a GPU the dot merger off, under sharded parameters the merged
    collectives."""
    options = dict(GPU_COMPILER_OPTIONS) if platform == "gpu" else {}
    if data_parallel > 1 and parallel == "fsdp":
        options |= SHARDED_COMPILER_OPTIONS
    flags = os.environ.get("XLA_FLAGS", "")
    return {k: v for k, v in options.items() if not re.search(rf"--{k}(=|\s|$)", flags)}


def shard_params(params, mesh: Mesh):
    """Per-parameter shardings for FSDP-style JAX: each parameter split along its first
    axis whose length the mesh's `data` axis divides, replicated where none does."""
    n = mesh.shape["data"]

    def spec(p):
        axis = next((i for i, d in enumerate(p.shape) if d % n == 0), None)
        return NamedSharding(mesh, P(*[None] * axis, "data") if axis is not None else P())

    return jax.tree_util.tree_map(spec, params)


class JaxSession:
    """Model state, optimizer state and one token batch on a device, each phase jitted.

    `weights`: a torch_impl model whose weights are copied in (the shared initialisation);
    None keeps Flax's own initialisation from `seed`. `data_parallel` > 1: the first N
    devices form a mesh with one `data` axis, the batch is sharded along it, parameters and
    optimizer state are replicated (`parallel` "ddp") or sharded (`shard_params`, "fsdp"),
    or the parameters replicated and the optimizer state sharded ("zero1"), and the same
    jitted functions run under those shardings (XLA inserts the collectives), compiled with
    `compiler_options`."""

    backend = "jax"

    def __init__(self, config: ModelConfig, tokens: np.ndarray, *, device: str, dtype: str, seed: int,
                 weights=None, data_parallel: int = 1, parallel: str = "ddp",
                 layer_ranges: bool = False) -> None:
        set_matmul_precision(dtype)
        self.dtype = dtype
        self._flat = None  # (parameters, AdamW state) in the few arrays of `_layout`, while the fused step holds them
        self.layer_ranges = layer_ranges
        devices = jax.devices("gpu" if device == "cuda" else "cpu")
        self.device = devices[0]
        params_at = batch_at = self.device
        if weights is None:
            model = jax_impl.TransformerLM(config, rngs=nnx.Rngs(seed))
        else:
            # Shapes only: Flax's own initialisation, run op by op outside any jit, would be
            # overwritten by the copy.
            model = nnx.eval_shape(lambda: jax_impl.TransformerLM(config, rngs=nnx.Rngs(seed)))
            torch_to_jax(weights, model)
        self.graphdef, params = nnx.split(model, nnx.Param)
        # The jitted phases take the parameters as a plain dict of arrays, not an nnx.State:
        # every call flattens its inputs and builds its outputs on the host, and an
        # nnx.State's Variables are pytree nodes flattened and rebuilt in Python, one per
        # array (the AdamW update of `large` takes 1,309), where a dict's are handled in
        # C++. nnx.merge takes the dict.
        params = params.to_pure_dict()
        mesh = None
        if data_parallel > 1:
            mesh = Mesh(np.array(devices[:data_parallel]), ("data",))
            batch_at = NamedSharding(mesh, P("data"))
            params_at = shard_params(params, mesh) if parallel == "fsdp" else NamedSharding(mesh, P())
        self.state = jax.device_put(params, params_at)
        self.tx = jax_impl.adamw()
        # The AdamW state on the mesh: replicated, or (fsdp, zero1) split like `shard_params`
        # splits the parameters (its step count replicated), the parameters whole on every
        # device under zero1.
        self.opt_state = self.tx.init(self.state)
        if data_parallel > 1:
            self.opt_state = jax.device_put(self.opt_state, shard_params(self.opt_state, mesh)
                                            if parallel in ("fsdp", "zero1") else params_at)
        else:  # every leaf committed to the device, as the update hands it back: an uncommitted
            # one (AdamW's step count) is another program to jit, compiled again on the second step
            self.opt_state = jax.device_put(self.opt_state, self.device)
        batch = jax.device_put(jnp.asarray(tokens, dtype=jnp.int32), batch_at)
        self.inputs, self.targets = batch[:, :-1], batch[:, 1:]
        self._vjp = None
        self._grads = None
        # Donating buffers is what a real training loop does; the CPU backend ignores it.
        donate = (0, 1) if self.device.platform != "cpu" else ()
        self.compiler_options = compiler_options(parallel, data_parallel, self.device.platform)
        # On a mesh each program runs with it set, for the kernels that split their work by device.
        self._jit = jit = jit_on(mesh, compiler_options=self.compiler_options or None)
        self._loss = jit(self._loss_fn)
        self._fwd = jit(lambda p, x, y: jax.vjp(lambda q: self._loss_fn(q, x, y), p))
        # Under data parallelism every program hands back the layouts it was given: the
        # gradients the parameters', the update the parameters' and the optimizer state's,
        # so no step reshards (or recompiles for) what the previous one returned.
        keep = {}
        if data_parallel > 1:
            shardings = lambda tree: jax.tree.map(lambda a: a.sharding, tree)  # noqa: E731
            params_sh, opt_sh = shardings(self.state), shardings(self.opt_state)
            keep = {"bwd": params_sh, "update": (params_sh, opt_sh),
                    "fused": (params_sh, opt_sh, NamedSharding(mesh, P()))}
        self._bwd = jit(lambda vjp: vjp(jnp.ones((), jnp.float32))[0], **_out(keep, "bwd"))
        self._update = jit(self._apply_update, donate_argnums=donate, **_out(keep, "update"))
        self._fused = jit(self._fused_step, donate_argnums=donate, **_out(keep, "fused"))
        # On one device, and with the parameters replicated over several, the fused step takes
        # the parameters and each AdamW moment as a few arrays (`harness.backends.jax.flat`):
        # `large`'s takes 21 arrays where the dict's took 984. The split step's programs keep the
        # model's arrays. The state moves between the two layouts when the other step runs next
        # (in a loop's warm-up, untimed), by programs that donate nothing: no output has an
        # input's shape to reuse its buffer, and the session drops the old layout's arrays as
        # soon as the new one is made. On a mesh every flat array is replicated, as the
        # parameters are; sharded parameters keep the dict (a flat array's shards would cut
        # across parameters).
        # Replicated over several, each array holds parameters whose gradients are summed in one
        # dtype (`sum_dtypes`), and the step sums each array itself (`_fused_flat_local`).
        replicated = data_parallel > 1 and parallel == "ddp"
        self._layout = (FlatLayout.of(self._state, kinds=sum_dtypes(self._state, dtype)) if replicated
                        else FlatLayout.of(self._state) if data_parallel == 1 else None)
        if self._layout is not None:
            whole = {"out_shardings": params_at} if data_parallel > 1 else {}
            step = self._fused_flat_step if not replicated else jax.shard_map(
                self._fused_flat_local, mesh=mesh, in_specs=(P(), P(), P("data"), P("data")), out_specs=P(),
                check_vma=False)
            self._fused_flat = jit(step, donate_argnums=donate, **whole)
            self._to_flat = jit(self._ravel_state, **whole)
            self._from_flat = jit(self._unravel_state, **whole)

    # -- the state, in the layout the step about to run takes --------------------------
    @property
    def state(self):
        """The parameters as the model's dict of arrays."""
        self._unflatten()
        return self._state

    @state.setter
    def state(self, value) -> None:
        self._unflatten()
        self._state = value

    @property
    def opt_state(self):
        """AdamW's state, its moments laid out like `state`."""
        self._unflatten()
        return self._opt_state

    @opt_state.setter
    def opt_state(self, value) -> None:
        self._unflatten()
        self._opt_state = value

    def _unflatten(self) -> None:
        if self._flat is not None:
            (self._state, self._opt_state), self._flat = self._from_flat(*self._flat), None

    def _ravel_state(self, params, opt_state) -> tuple:
        return self._layout.ravel(params), self._layout.ravel_all(opt_state)

    def _unravel_state(self, flat, opt_state) -> tuple:
        return self._layout.unravel(flat), self._layout.unravel_all(opt_state)

    def _flatten(self) -> tuple:
        if self._flat is None:
            self._flat = self._to_flat(self._state, self._opt_state)
            self._state = self._opt_state = None
        return self._flat

    def _loss_fn(self, params, inputs, targets):
        model = nnx.merge(self.graphdef, compute_params(params, self.dtype))
        logits = model(inputs)
        with jax.named_scope("loss"):
            return jax_impl.cross_entropy_loss(logits, targets)

    def _apply_update(self, params, opt_state, grads):
        updates, opt_state = self.tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def _fused_step(self, params, opt_state, inputs, targets):
        loss, grads = jax.value_and_grad(self._loss_fn)(params, inputs, targets)
        params, opt_state = self._apply_update(params, opt_state, grads)
        return params, opt_state, loss

    def _fused_flat_step(self, flat, opt_state, inputs, targets):
        """The fused step on the flat layout: the split into the model's parameters is
        inside the program, and so is the concatenation of their gradients."""
        loss, grads = jax.value_and_grad(lambda p: self._loss_fn(self._layout.unravel(p), inputs, targets))(flat)
        flat, opt_state = self._apply_update(flat, opt_state, grads)
        return flat, opt_state, loss

    def _fused_flat_local(self, flat, opt_state, inputs, targets):
        """The replicated fused step as each device runs it (under `jax.shard_map`): the
        gradients of its share of the batch, each array of them summed over the devices in its
        parameters' dtype in the backward (the matmul weights' in bf16, as XLA sums them in the
        step it partitions itself), then the update every device applies alike. Each all-reduce
        then reads an array the update takes as it is: XLA's own sums, one per gradient, are
        combined by copying the gradients into one buffer and out again, and the split-K halves
        of a weight's gradient are summed before them instead of inside the update."""
        devices = jax.lax.axis_size("data")
        loss, grads = jax.value_and_grad(lambda p: self._loss_fn(self._layout.unravel(p), inputs, targets))(flat)
        grads = tuple(jax.lax.psum(g.astype(kind), "data").astype(g.dtype) / devices
                      for g, kind in zip(grads, self._layout.kinds, strict=True))
        flat, opt_state = self._apply_update(flat, opt_state, grads)
        return flat, opt_state, jax.lax.pmean(loss, "data")

    def sync(self, value: object = None) -> None:
        """Wait for `value` (default: the parameters) to be computed."""
        jax.block_until_ready(value if value is not None else (self._flat or self._state))

    # -- phases ---------------------------------------------------------------------
    def forward(self, *, grad: bool = True) -> jax.Array:
        if not grad:
            return self._loss(self.state, self.inputs, self.targets)
        loss, self._vjp = self._fwd(self.state, self.inputs, self.targets)
        return loss

    def backward(self) -> jax.Array:
        self._grads, self._vjp = self._bwd(self._vjp), None
        return self._grads

    def optimizer_step(self):
        self.state, self.opt_state = self._update(self.state, self.opt_state, self._grads)
        self._grads = None
        return self.state

    def zero_grad(self) -> None:
        self._grads = self._vjp = None

    def fused_step(self) -> jax.Array:
        if self._layout is None:
            self.state, self.opt_state, loss = self._fused(self.state, self.opt_state, self.inputs, self.targets)
            return loss
        params, opt_state, loss = self._fused_flat(*self._flatten(), self.inputs, self.targets)
        self._flat = (params, opt_state)
        return loss

    def plain_step(self) -> jax.Array:
        """forward + backward + optimizer with no ranges: one fused jitted step."""
        return self.fused_step()

    def align(self) -> None:
        """One process drives every device: waiting for them is all there is to align."""
        self.sync()

    # -- layer attribution ----------------------------------------------------------
    def _lowered(self) -> dict:
        """Each jitted phase lowered from abstract arguments, by phase name (the range names):
        the backward's `jax.vjp` residuals come from `jax.eval_shape`, so nothing runs."""
        spec = lambda tree: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)  # noqa: E731
        args = (self.state, self.inputs, self.targets)
        vjp = self._fwd.eval_shape(*args)[1]
        return {
            "forward": self._fwd.lower(*args),
            "backward": self._bwd.lower(vjp),
            "optimizer": self._update.lower(spec(self.state), spec(self.opt_state), spec(self.state)),
            "fused_step": (self._fused.lower(spec(self.state), spec(self.opt_state), self.inputs, self.targets)
                           if self._layout is None else
                           self._fused_flat.lower(self._layout.spec(), jax.eval_shape(self._layout.ravel_all,
                                                                                      spec(self.opt_state)),
                                                  self.inputs, self.targets)),
        }

    def optimized_hlo(self) -> dict[str, str]:
        """XLA's optimized HLO text of each jitted phase, by phase name (the range names).
        Compiling reuses the process's autotuning results, so the schedule is the one the
        timed steps ran."""
        return {phase: low.compile().as_text() for phase, low in self._lowered().items()}

    def memory_analysis(self) -> dict[str, dict[str, int]]:
        """XLA's own account of each jitted phase's device memory, by phase name, in bytes:
        its arguments, its outputs (the forward's are the residuals it hands the backward),
        its temporaries, the outputs that reuse donated arguments, and its peak. `peak_bound`
        is 1 where that peak is the upper bound arguments + outputs + temporaries - aliased:
        on the CPU, whose XLA reports as the peak about the arguments and outputs alone, and
        wherever the reported peak is missing or below the program's own temporaries (one
        allocation, live while it runs). Compiled, not run."""
        out = {}
        for phase, low in self._lowered().items():
            m = low.compile().memory_analysis()
            sizes = {k: int(getattr(m, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp", "alias")}
            peak = int(getattr(m, "peak_memory_in_bytes", 0) or 0)
            sizes["peak_bound"] = int(self.device.platform == "cpu" or peak < max(sizes["temp"], 1))
            if sizes["peak_bound"]:
                peak = sizes["argument"] + sizes["output"] + sizes["temp"] - sizes["alias"]
            sizes["peak"] = peak
            out[phase] = sizes
        return out

    def write_hlo(self, directory: str | Path) -> dict[str, str]:
        """Write `optimized_hlo` as `directory`/<phase>.txt; returns phase -> path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = {}
        for phase, text in self.optimized_hlo().items():
            (directory / f"{phase}.txt").write_text(text)
            paths[phase] = str(directory / f"{phase}.txt")
        return paths

    # -- memory ---------------------------------------------------------------------
    def reset_peak_memory(self) -> None:
        """XLA's allocator keeps one high-water mark per process; it cannot be reset."""

    def peak_memory(self) -> int | None:
        stats = self.device.memory_stats()
        return stats.get("peak_bytes_in_use") if stats else None

    # -- values for parity ----------------------------------------------------------
    def logits(self) -> np.ndarray:
        fn = self._jit(lambda p, x: nnx.merge(self.graphdef, compute_params(p, self.dtype))(x))
        return np.asarray(fn(self.state, self.inputs), dtype=np.float32)

    def loss_and_grads(self) -> tuple[float, dict[str, np.ndarray]]:
        # The timed forward and backward, as torch's side does: the same executables, so a
        # persistent compilation cache filled by a timed run serves them without compiling.
        loss, vjp = self._fwd(self.state, self.inputs, self.targets)
        grads = self._bwd(vjp)
        return float(loss), {k: np.asarray(v, np.float32) for k, v in _flat(grads).items()}

    def params(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(v, np.float32) for k, v in _flat(self.state).items()}

    def device_name(self) -> str | None:
        return getattr(self.device, "device_kind", None) if self.device.platform == "gpu" else None

    def versions(self) -> dict:
        import flax

        return {"jax": jax.__version__, "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else None,
                "flax": flax.__version__, "optax": optax.__version__}


def _out(keep: dict, name: str) -> dict:
    """`jax.jit`'s out_shardings for program `name`, where `keep` fixes them."""
    return {"out_shardings": keep[name]} if name in keep else {}


def _flat(state) -> dict[str, jax.Array]:
    """A dict of arrays (the parameters or their gradients) by dotted path, as torch names them."""
    return {".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): v
            for path, v in jax.tree_util.tree_flatten_with_path(state)[0]}
