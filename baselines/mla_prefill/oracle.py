"""fp64 absorbed-MLA causal prefill: the oracle for mla_prefill.

Chunked over queries so the fp64 scores of one chunk stay <= ~1 GiB. Everything (inputs, products,
softmax) is float64 on the inputs' device. Cost at N = 8192, H = 64: 4.67 TFLOP in fp64, i.e. well under a
second of DGEMM on an H200 (~60 TFLOP/s fp64 tensor cores) plus the chunk softmaxes; on a CPU it is hours,
so CPU tests use the tiny cpu_shape.
"""

import torch


def mla_prefill_fp64(q: torch.Tensor, cache: torch.Tensor, dl: int, scale: float,
                     chunk: int | None = None) -> torch.Tensor:
    """q [N, H, D], cache [N, D] -> o [N, H, dl] float64; query i attends to cache rows 0..i."""
    N, H, D = q.shape
    c64 = cache.to(torch.float64)
    out = torch.empty(N, H, dl, dtype=torch.float64, device=q.device)
    if chunk is None:
        chunk = max(1, (1 << 27) // (H * N))  # chunk * H * N fp64 scores = 1 GiB
    for i0 in range(0, N, chunk):
        i1 = min(N, i0 + chunk)
        qc = q[i0:i1].to(torch.float64).reshape(-1, D)
        s = (qc @ c64[:i1].t()).view(i1 - i0, H, i1) * scale
        future = torch.arange(i1, device=q.device)[None, :] > torch.arange(i0, i1, device=q.device)[:, None]
        s.masked_fill_(future[:, None, :], float("-inf"))
        s = s - s.amax(dim=-1, keepdim=True)
        p = s.exp()
        p = p / p.sum(dim=-1, keepdim=True)
        out[i0:i1] = (p.view(-1, i1) @ c64[:i1, :dl]).view(i1 - i0, H, dl)
    return out
