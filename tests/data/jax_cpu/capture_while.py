"""A jitted step whose matmuls run in a `lax.fori_loop` (XLA's `while` thunk), recorded on a
CPU with `harness.backends.profilers.jax_profiler` inside a `step` range, three times.

jax.profiler writes `trace/plugins/profile/<run>/<host>.xplane.pb` and, beside it, its
trace-viewer export `<host>.trace.json.gz`: `jax_while_cpu.xplane.pb.gz` is one run's
XSpace (gzipped), `jax_while_cpu.trace.json.gz` a later run's export (jax 0.10.2)."""
import jax
import jax.numpy as jnp

from harness.backends import profilers


@jax.jit
def step(x, w):
    return jax.lax.fori_loop(0, 4, lambda i, y: jnp.tanh(y @ w), x)


x = jnp.ones((256, 256)) * 0.01
w = jnp.eye(256) * 0.5
step(x, w).block_until_ready()  # compiled before the trace
with profilers.jax_profiler("trace"):
    for _ in range(3):
        with jax.profiler.TraceAnnotation("step"):
            step(x, w).block_until_ready()
