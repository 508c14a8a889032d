"""A fresh process's fixed costs on the GPU: torch import, CUDA init, first tensor, first Triton kernel."""

import time

t0 = time.time()
import torch  # noqa: E402

t1 = time.time()
torch.cuda.init()
t2 = time.time()
x = torch.zeros(1, device="cuda")
torch.cuda.synchronize()
t3 = time.time()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def k(p):
    tl.store(p, 1.0)


k[(1,)](x)
torch.cuda.synchronize()
t4 = time.time()
print(
    f"import torch {t1 - t0:.2f} s, cuda init {t2 - t1:.2f} s, first tensor {t3 - t2:.2f} s,"
    f" first triton kernel {t4 - t3:.2f} s"
)
