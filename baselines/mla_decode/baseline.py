"""Baselines for mla_decode: the plain PyTorch absorbed reference, written the fast way.

All heads (and all Q query tokens) share one cache, so the scores are ONE matrix product
[Q*H, D] @ [D, S] -- not a broadcast 4-D matmul ([1,H,1,D] @ [1,1,D,S] measured 3.7x slower on an H200,
kernel-notes section 0). Softmax in fp32, then one product [Q*H, S] @ [S, DL] with V = cache[:, :DL].

* `torch_bmm_bf16` (primary): both products in the input dtype (bf16 on the GPU: cuBLAS accumulates in
  fp32 and rounds the scores to bf16), scores upcast to fp32 before scale + softmax, P cast back to bf16.
* `torch_bmm_fp32`: the same with both products in fp32 (scores never rounded to bf16); slower, more
  accurate.
"""

import torch

from baselines.mla_decode.spec import SCALE, latent_dim


def torch_bmm_bf16(inputs: dict) -> dict:
    q, cache = inputs["q"], inputs["kv_cache"]
    Q, H, D = q.shape
    dl = latent_dim(D)
    s = (q.reshape(Q * H, D) @ cache.t()).float() * SCALE  # [Q*H, S] fp32
    p = torch.softmax(s, dim=-1)
    o = p.to(cache.dtype) @ cache[:, :dl]  # [Q*H, DL]
    return {"o": o.view(Q, H, dl)}


def torch_bmm_fp32(inputs: dict) -> dict:
    q, cache = inputs["q"], inputs["kv_cache"]
    Q, H, D = q.shape
    dl = latent_dim(D)
    c32 = cache.float()
    s = (q.reshape(Q * H, D).float() @ c32.t()) * SCALE
    p = torch.softmax(s, dim=-1)
    o = p @ c32[:, :dl]
    return {"o": o.to(q.dtype).view(Q, H, dl)}
