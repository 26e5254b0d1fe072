"""torch SDPA forward+backward through cuDNN on an FA3 shape; the second call is profiled. usage: d seq true|false"""
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
d, seq, causal = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "true"
shape = (16384 // seq, 2048 // d, seq, d)
q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
do = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for i in range(2):
        torch.cuda.synchronize()
        if i == 1:
            torch.cuda.cudart().cudaProfilerStart()
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        o.backward(do)
        torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
