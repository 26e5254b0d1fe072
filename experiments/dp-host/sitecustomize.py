# Experiment switches for data-parallel runs (not product code), read at interpreter start:
#   XP_BIND=1          pin each rank process (LOCAL_RANK of LOCAL_WORLD_SIZE) to its own slice of the CPUs
#   XP_OPTIMIZE_DDP=0  torch._dynamo.config.optimize_ddp = False (or a string value)
#   XP_REGIONAL=1      torch-compile: compile each transformer block instead of the whole loss
import os

if os.environ.get("XP_BIND") == "1" and "LOCAL_RANK" in os.environ:
    cpus = sorted(os.sched_getaffinity(0))
    n, r = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), int(os.environ["LOCAL_RANK"])
    size = len(cpus) // n
    if size:
        os.sched_setaffinity(0, cpus[r * size:(r + 1) * size])
        print(f'[xp] rank {r} cpus {min(cpus[r*size:(r+1)*size])}-{max(cpus[r*size:(r+1)*size])}', file=__import__('sys').stderr)

if "XP_OPTIMIZE_DDP" in os.environ or os.environ.get("XP_REGIONAL") == "1":
    import sys

    class _Hook:
        def find_spec(self, name, path, target=None):
            return None

    def _patch():
        import torch._dynamo
        v = os.environ.get("XP_OPTIMIZE_DDP")
        if v is not None:
            torch._dynamo.config.optimize_ddp = False if v == "0" else v
        if os.environ.get("XP_REGIONAL") == "1":
            import types
            from harness.timing import torch_backend as tb
            orig = tb.TorchCompileSession.__init__

            def init(self, *a, **k):
                orig(self, *a, **k)
                self._loss_of = types.MethodType(tb.TorchSession._loss_of, self)
                for block in self.model.layers:
                    block.compile(mode=tb.COMPILE_MODES[self.backend])
            tb.TorchCompileSession.__init__ = init
        print(f'[xp] optimize_ddp={torch._dynamo.config.optimize_ddp} regional={os.environ.get("XP_REGIONAL")}', file=sys.stderr)

    import builtins
    _real_import = builtins.__import__
    _done = []

    def _imp(name, *a, **k):
        mod = _real_import(name, *a, **k)
        if not _done and "harness.timing.torch_backend" in sys.modules and \
                hasattr(sys.modules["harness.timing.torch_backend"], "TorchCompileSession"):
            _done.append(1)
            _patch()
        return mod
    builtins.__import__ = _imp
