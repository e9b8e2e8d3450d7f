"""fp64 absorbed-MLA decode: the oracle every mla_decode candidate and baseline is compared with."""

import torch


def mla_decode_fp64(q: torch.Tensor, cache: torch.Tensor, dl: int, scale: float) -> torch.Tensor:
    """q [Q, H, D], cache [S, D] -> o [Q, H, dl] in float64 (on q's device).

    Same math as the kernel, in fp64 throughout: s = scale * q @ cache^T over all D columns, softmax over
    the S cache rows (max subtracted), o = p @ cache[:, :dl]. Cost on the GPU shape: ~1.1 GFLOP fp64.
    """
    q64 = q.to(torch.float64)
    c64 = cache.to(torch.float64)
    s = torch.einsum("thd,sd->ths", q64, c64) * scale
    s = s - s.amax(dim=-1, keepdim=True)
    p = s.exp()
    p = p / p.sum(dim=-1, keepdim=True)
    return torch.einsum("ths,sd->thd", p, c64[:, :dl])
