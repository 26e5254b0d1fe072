# NVIDIA H100 80GB HBM3, 580.159.04, jax 0.11.2 torch 2.11.0+cu130 cuDNN 91900; commit a38bced; FA3 shape batch 1 x seq 16384 x 16 heads x head_dim 128, bf16, causal
# S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis"
# M='smsp__inst_executed.sum,sm__cycles_elapsed.avg.per_second,lts__t_sectors_op_red.sum,lts__t_requests_op_red.sum,regex:^sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active$'
# ours (the fused backward, the head_dim 128 causal default at this length). This first attempt exited 139:
# JAX's runtime crashed in interpreter teardown after the kernels ran, and ncu wrote no report (empty CSV):
$ timeout 200 ncu --clock-control none -k regex:flash_attention_mgpu_bwd --launch-count 1 $S --metrics "$M" --csv --page details python -m harness.attention_once --backend mosaic --batch 1 --seq 16384 --heads 16 --head-dim 128 --causal true > bwd16k-mosaic-causal-true.csv
# so it ran again through once.py, which leaves without teardown the way `python -m harness.attention_once`
# itself does from commit 650c93b. once.py:
#   import os, sys
#   from harness import attention_once
#   rc = attention_once.main(sys.argv[1:]); sys.stdout.flush(); sys.stderr.flush(); os._exit(rc or 0)
$ timeout 200 ncu --clock-control none -k regex:flash_attention_mgpu_bwd --launch-count 1 $S --metrics "$M" --csv --page details python once.py --backend mosaic --batch 1 --seq 16384 --heads 16 --head-dim 128 --causal true > bwd16k-mosaic-causal-true.csv
# exit 0
# cuDNN through torch, its backward kernel in the second forward+backward call:
$ timeout 200 ncu --clock-control none --profile-from-start off -k regex:bprop $S --metrics "$M" --csv --page details python results/attention-mgpu-h100/ncu/sdpa_bwd_once.py 128 16384 true > bwd16k-cudnn-causal-true.csv
# exit 0
# summaries: python -m harness.ncu X.csv > X.md
