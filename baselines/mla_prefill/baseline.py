"""Baselines for mla_prefill.

* `torch_reference` (primary): plain PyTorch, chunked over queries (CHUNK queries x H heads at a time so
  the fp32 scores stay ~0.5 GB), each chunk only against the cache rows it can see (0..last query of the
  chunk): one GEMM [CHUNK*H, D] @ [D, i1] in the input dtype, scores upcast to fp32, scaled, causal mask,
  fp32 softmax, P cast to the input dtype, one GEMM with V = cache[:i1, :DL].
* `torch_sdpa`: torch.nn.functional.scaled_dot_product_attention(is_causal=True, scale=1/sqrt(192)) with
  q [1, H, N, D], K = the cache expanded (stride 0) over heads, V = cache[:, :DL] expanded likewise
  (d_k = 576 != d_v = 512; torch picks the backend: on an H200 EFFICIENT_ATTENTION, since the flash and
  cuDNN backends refuse head dimensions above 256).
"""

import torch
import torch.nn.functional as F

from baselines.mla_decode.baseline import mm_fp32_out
from baselines.mla_decode.dims import SCALE, latent_dim

CHUNK = 256


def torch_reference(inputs: dict) -> dict:
    q, cache = inputs["q"], inputs["kv_cache"]
    N, H, D = q.shape
    dl = latent_dim(D)
    o = torch.empty(N, H, dl, dtype=q.dtype, device=q.device)
    for i0 in range(0, N, CHUNK):
        i1 = min(N, i0 + CHUNK)
        s = mm_fp32_out(q[i0:i1].reshape(-1, D), cache[:i1].t()).view(i1 - i0, H, i1) * SCALE
        future = torch.arange(i1, device=q.device)[None, :] > torch.arange(i0, i1, device=q.device)[:, None]
        s.masked_fill_(future[:, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1).to(q.dtype)
        o[i0:i1] = (p.view(-1, i1) @ cache[:i1, :dl]).view(i1 - i0, H, dl)
    return {"o": o}


def torch_sdpa(inputs: dict) -> dict:
    q, cache = inputs["q"], inputs["kv_cache"]
    N, H, D = q.shape
    dl = latent_dim(D)
    qh = q.permute(1, 0, 2).unsqueeze(0)  # [1, H, N, D]
    k = cache.view(1, 1, N, D).expand(1, H, N, D)
    v = cache[:, :dl].unsqueeze(0).unsqueeze(0).expand(1, H, N, dl)
    o = F.scaled_dot_product_attention(qh, k, v, is_causal=True, scale=SCALE)  # [1, H, N, dl]
    return {"o": o[0].permute(1, 0, 2)}
