"""torch SDPA forward through cuDNN, twice (the first launch warms up), FA3 shape 4 x 16 x 4096 x 128."""
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
causal = sys.argv[1] == "true"
q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch.no_grad():
    for _ in range(2):
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
torch.cuda.synchronize()
