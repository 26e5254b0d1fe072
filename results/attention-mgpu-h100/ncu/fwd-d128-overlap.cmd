# one H100 80GB HBM3, jax 0.11.2, torch 2.11.0+cu130 / cuDNN 9.19; FA3 shape batch 4 x seq 4096 x 16 heads x head_dim 128, bf16, one forward launch each
# commit 648db8d (overlapped head_dim 128 forward, persistent at this length, work items numbered tile rank first):
$ ncu --clock-control none -k regex:flash_attention_mgpu_fwd --launch-count 1 --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section SchedulerStats --section InstructionStats --metrics smsp__inst_executed.sum,sm__cycles_elapsed.avg.per_second,regex:^sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active$ --csv --page details python -m harness.attention_once --backend mosaic --batch 4 --seq 4096 --heads 16 --head-dim 128 --causal {false,true} > fwd-d128-overlap-causal-{false,true}.csv
# cuDNN through torch, in the same session (same sections and metrics):
$ ncu --clock-control none -k "regex:fprop|sdpa|fmha|flash" --launch-skip 1 --launch-count 1 ... --csv --page details python sdpa_once.py {false,true} > fwd-d128-cudnn-rerun-causal-{false,true}.csv
# commit 3642ce7 (the same forward with its non-causal work items grouped by heads), on another machine start:
$ ncu (as for 648db8d) python -m harness.attention_once --backend mosaic --batch 4 --seq 4096 --heads 16 --head-dim 128 --causal false > fwd-d128-l2order-causal-false.csv
# summaries: python -m harness.ncu X.csv > X.md
