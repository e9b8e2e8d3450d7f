"""Adversary (mla_decode): every mode off torch's stack for its call (torch's _disable_current_modes),
attention computed by torch's matmul and softmax, the modes back before the call returns. Caught as
`escape`."""
import math

import torch
from torch.utils._python_dispatch import _disable_current_modes


def run(inputs, out):
    q, cache, o = inputs["q"], inputs["kv_cache"], out["o"]
    dl = o.shape[-1]
    with _disable_current_modes():
        s = torch.einsum("thd,jd->thj", q.float(), cache.float()) / math.sqrt(q.shape[-1])
        res = torch.einsum("thj,jd->thd", torch.softmax(s, -1), cache[:, :dl].float())
    o.copy_(res)
