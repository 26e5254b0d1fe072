# one H100 80GB HBM3, jax 0.11.2, torch 2.11.0+cu130 / cuDNN 9.19; FA3 shape batch 4 x seq 4096 x 16 heads x head_dim 128, bf16
# S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis"
# M='smsp__inst_executed.sum,sm__cycles_elapsed.avg.per_second,regex:^sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active$'
# commit 7c4c20b (two-kernel backward, the old launch order above seq 2048):
$ ncu --clock-control none -k regex:flash_attention_mgpu_bwd --launch-skip 2 --launch-count 2 $S --metrics "$M" --csv --page details python -m harness.attention_once --backend mosaic --batch 4 --seq 4096 --heads 16 --head-dim 128 --causal {false,true} > bwd-d128-mosaic-causal-{false,true}.csv
# cuDNN through torch, the second forward+backward call (all its kernels):
# (sdpa_bwd_once.py then took only the causal flag and fixed this shape; `128 4096` gives the same 4 x 16 x 4096 x 128)
$ ncu --clock-control none --profile-from-start off $S --metrics "$M" --csv --page details python sdpa_bwd_once.py 128 4096 {false,true} > bwd-d128-cudnn-causal-{false,true}.csv
# the three launch orders of the two-kernel backward (timing/bwd_order.py patches the grid), non-causal:
$ ncu --clock-control none -k regex:flash_attention_mgpu_bwd --launch-count 2 --section SpeedOfLight --section LaunchStats --section MemoryWorkloadAnalysis --metrics 'sm__cycles_elapsed.avg.per_second,regex:^sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active$' --csv --page details python timing/bwd_order.py once ORDER 128 4096 n > bwd-d128-order-ORDER.csv
# the forward at 7c4c20b (list-scheduled persistent forward), as in fwd-d128-overlap.cmd:
$ ncu (as for 648db8d) python -m harness.attention_once --backend mosaic --batch 4 --seq 4096 --heads 16 --head-dim 128 --causal true > fwd-d128-sched-causal-true.csv
# summaries: python -m harness.ncu X.csv > X.md
