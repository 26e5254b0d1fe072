# NVIDIA H100 80GB HBM3, 580.159.04, 700 W, jax 0.11.2 torch 2.11.0+cu130 cuDNN 91900; commit 1040794; one launch each, clocks not locked
# S and M as in bwd16k.cmd
# ours with mask_tile (the head_dim 128 default from 068fe24), against bwd16k-mosaic-causal-true.csv (without) and bwd16k-cudnn-causal-true.csv:
$ timeout 200 ncu --clock-control none -k regex:flash_attention_mgpu_bwd --launch-count 1 $S --metrics "$M" --csv --page details python -m harness.attention_once --backend mosaic --batch 1 --seq 16384 --heads 16 --head-dim 128 --causal true > bwd16k-tile-mosaic-causal-true.csv
# the short non-causal forward, ours and cuDNN's (sdpa_once.py now takes head_dim and seq; batch 16384 / seq):
$ timeout 120 ncu --clock-control none -k regex:flash_attention_mgpu_fwd --launch-count 1 $S --metrics "$M" --csv --page details python -m harness.attention_once --backend mosaic --batch 16 --seq 1024 --heads 16 --head-dim 128 --causal false > fwd1k-d128-mosaic-causal-false.csv
$ timeout 120 ncu --clock-control none -k "regex:fprop|sdpa|fmha|flash" --launch-skip 1 --launch-count 1 $S --metrics "$M" --csv --page details python results/attention-mgpu-h100/ncu/sdpa_once.py false 128 1024 > fwd1k-d128-cudnn-causal-false.csv
# summaries: python -m harness.ncu X.csv > X.md
