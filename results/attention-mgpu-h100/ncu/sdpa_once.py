"""torch SDPA forward through cuDNN, twice (the first launch warms up), an FA3 shape:
batch 16384 / seq x 2048 / head_dim heads x seq x head_dim (default 4 x 16 x 4096 x 128).
usage: python sdpa_once.py true|false [HEAD_DIM SEQ]"""
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
causal = sys.argv[1] == "true"
head_dim, seq = (int(x) for x in sys.argv[2:4]) if len(sys.argv) > 3 else (128, 4096)
q, k, v = (torch.randn(16384 // seq, 2048 // head_dim, seq, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch.no_grad():
    for _ in range(2):
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
torch.cuda.synchronize()
