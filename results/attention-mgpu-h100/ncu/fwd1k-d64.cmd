# NVIDIA H100 80GB HBM3, 580.159.04, 700 W, jax 0.11.2 torch 2.11.0+cu130 cuDNN 91900; commit 2379719; one launch each, clocks not locked
# FA3 shape batch 16 x seq 1024 x 32 heads x head_dim 64, bf16, the forward: ours (causal: two consumers; non-causal: three, the last tile's third consumers idle) and cuDNN's through torch
# S as in bwd16k.cmd; M='smsp__inst_executed.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,dram__bytes_write.sum,regex:^sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active$'
$ timeout 110 ncu --clock-control none -k regex:flash_attention_mgpu_fwd --launch-count 1 $S --metrics "$M" --csv --page details python -m harness.attention_once --backend mosaic --batch 16 --seq 1024 --heads 32 --head-dim 64 --causal {true,false} > fwd1k-d64-mosaic-causal-{true,false}.csv
$ timeout 110 ncu --clock-control none -k "regex:fprop|sdpa|fmha|flash" --launch-skip 1 --launch-count 1 $S --metrics "$M" --csv --page details python results/attention-mgpu-h100/ncu/sdpa_once.py {true,false} 64 1024 > fwd1k-d64-cudnn-causal-{true,false}.csv
# all four exit 0; summaries: python -m harness.ncu X.csv > X.md
