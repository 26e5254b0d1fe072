"""Explain the gap between two runs (the library behind `python -m harness.diff`).

`inputs` resolves what names a run (a compare folder's backend, a `harness.run` JSON, a
profile) into `inputs.Run` (kernel-launch calls per phase from the profile's source,
`harness.trace.sources.load.launches_of`);
`decompose` subtracts one run from the other per phase and cause; `render` writes
diff.md, diff.json and diff.png.
"""
