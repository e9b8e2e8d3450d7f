"""Baselines for mla_decode: the plain PyTorch absorbed reference, written the fast way.

All heads (and all Q query tokens) share one cache, so the scores are ONE matrix product
[Q*H, D] @ [D, S] -- not a broadcast 4-D matmul ([1,H,1,D] @ [1,1,D,S] measured 3.7x slower on an H200).
Softmax in fp32, then one product [Q*H, S] @ [S, DL] with V = cache[:, :DL].

* `torch_bmm` (primary): the score GEMM in the input dtype with an fp32 result
  (`torch.mm(..., out_dtype=torch.float32)` on CUDA: bf16 tensor cores, fp32 accumulation, scores NOT
  rounded to bf16), fp32 scale + softmax, P cast to bf16 for the second GEMM. Same precision recipe as the
  kernels. Where `out_dtype` is unavailable (CPU) it falls back to `(a @ b).float()`.
* `torch_bmm_bf16`: scores from a plain bf16 GEMM (rounded to bf16) then `.float()`, the common fast form;
  its bf16-rounded logits give 2.5x (unit) to 12x (peaked) the error of the primary, so it is not used for
  the tolerance.
* `torch_bmm_fp32`: both products in fp32; slower, most accurate.
"""

import torch

from baselines.mla_decode.dims import SCALE, latent_dim

#: whether torch.mm(..., out_dtype=torch.float32) works for bf16 on this device (None: not tried yet)
MM_OUT_DTYPE: dict = {}


def mm_fp32_out(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with an fp32 result; bf16/fp16 operands stay on the tensor cores where torch allows it."""
    if a.dtype == torch.float32:
        return a @ b
    key = a.device.type
    if MM_OUT_DTYPE.get(key, True):
        try:
            out = torch.mm(a, b, out_dtype=torch.float32)
            MM_OUT_DTYPE[key] = True
            return out
        except (RuntimeError, TypeError, NotImplementedError):
            MM_OUT_DTYPE[key] = False
    return (a @ b).float()


def torch_bmm(inputs: dict) -> dict:
    q, cache = inputs["q"], inputs["kv_cache"]
    Q, H, D = q.shape
    dl = latent_dim(D)
    s = mm_fp32_out(q.reshape(Q * H, D), cache.t()) * SCALE  # [Q*H, S] fp32
    p = torch.softmax(s, dim=-1)
    o = p.to(cache.dtype) @ cache[:, :dl]  # [Q*H, DL]
    return {"o": o.view(Q, H, dl)}


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
