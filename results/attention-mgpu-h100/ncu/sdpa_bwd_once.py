"""torch SDPA forward+backward through cuDNN, FA3 shape 4 x 16 x 4096 x 128 bf16; the second call is profiled."""
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
causal = sys.argv[1] == "true"
q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
do = torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for i in range(2):
        torch.cuda.synchronize()
        if i == 1:
            torch.cuda.cudart().cudaProfilerStart()
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        o.backward(do)
        torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
