"""Fresh values for timing and for parameters, drawn from a generator on the tensors' own device.

Timing (Problem.perturbed): every timed repetition's inputs are a pool set mixed with values drawn for that
repetition alone, so no repetition sees contents, or a permutation of contents, seen before; the change
moves the answer by far more than any tolerance, so a memo that matched on some invariant anyway would
hand back a wrong answer.

Parameters (vary_parameters): a module's parameters and buffers as its own initialisation drew them,
scaled and shifted per case, so that none keeps a value that makes it a no-op (LayerNorm's weight 1 and
bias 0).

No torch at import time: problems import this from their spec. On a GPU each law is one pass of
baselines.perturb_kernels (the refill runs inside the timing window); elsewhere, torch's ops.
"""

from __future__ import annotations

import hashlib
import math

#: a timed repetition's latent values are MIX x the pool's + MIX x fresh ones: for standard normal latents
#: the mixture is standard normal again (MIX^2 + MIX^2 = 1), so the distribution is exactly kept
MIX = math.sqrt(0.5)
#: the default relative noise: each float element times exp(s z - s^2 / 2), z standard normal (mean kept,
#: sign and zeros kept, so positive inputs stay positive); a 25% change moves any answer that depends on
#: its inputs far beyond a tolerance
RELATIVE = 0.25
#: parameters: each element times exp(PARAM_SCALE z), plus PARAM_SHIFT x (its tensor's RMS, 1 for an all-zero
#: tensor) x z' where the tensor has elements of both signs or is all zero
PARAM_SCALE = 0.3
PARAM_SHIFT = 0.1


def normal_like(t, generator, dtype=None):
    """Standard normal values of t's shape on t's device, in fp32 (or `dtype`)."""
    import torch

    return torch.randn(t.shape, generator=generator, device=t.device, dtype=dtype or torch.float32)


def _one_pass(t) -> bool:
    """Whether t's law runs as one kernel pass: a contiguous, non-empty CUDA tensor of a float dtype the
    kernels load and store, whose element indices fit the draws' 32-bit counters."""
    import torch

    return (t.is_cuda and t.is_contiguous() and 0 < t.numel() < 1 << 32
            and t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64))


def _stream(generator) -> int:
    """A seed for one tensor's draws: the generator's seed and offset hashed, the offset then moved on, as a
    torch draw moves it (host arithmetic only: no device op, no synchronisation in the refill)."""
    offset = generator.get_offset()
    generator.set_offset(offset + 4)
    d = hashlib.sha256(f"{generator.initial_seed()}:{offset}".encode()).digest()
    return 1 << 62 | int.from_bytes(d[:8], "little") >> 2  # always a 64-bit argument: one compiled kernel


def _elementwise(src, generator, mode: int, a: float = 0.0, b: float = 0.0, dtype=None):
    import torch

    from baselines import perturb_kernels

    out = torch.empty_like(src, dtype=dtype or src.dtype)
    perturb_kernels.elementwise(src, out, _stream(generator), mode, a, b)
    return out


def mixed(t, generator, scale: float = 1.0):
    """t (a tensor of N(0, scale^2) values) mixed with as many fresh ones: N(0, scale^2) again, in t's dtype.
    In place on the fresh fp32 draw: one fp32 temporary of t's size."""
    if _one_pass(t):
        from baselines.perturb_kernels import MIX as MODE

        return _elementwise(t, generator, MODE, MIX * scale, MIX)
    return normal_like(t, generator).mul_(MIX * scale).add_(t, alpha=MIX).to(t.dtype)


def relative_noise(t, generator, s: float = RELATIVE):
    """t times exp(s z - s^2/2) elementwise (the default perturbation of a float input), in t's dtype."""
    if _one_pass(t):
        from baselines.perturb_kernels import RELATIVE as MODE

        return _elementwise(t, generator, MODE, s)
    return normal_like(t, generator).mul_(s).sub_(0.5 * s * s).exp_().mul_(t).to(t.dtype)


def renormalized(t, generator, noise: float):
    """t's rows (its last dimension) plus `noise` times fresh standard normal values, normalised again: a
    unit vector moved by an independent one, in t's dtype."""
    import torch.nn.functional as F

    D = t.shape[-1]
    if _one_pass(t) and D & (D - 1) == 0:
        import torch

        from baselines import perturb_kernels

        out = torch.empty_like(t)
        perturb_kernels.rows(t, out, _stream(generator), noise)
        return out
    f = t.float()
    return F.normalize(f + normal_like(f, generator) * noise, p=2, dim=-1).to(t.dtype)


def logsigmoid_drawn(like, generator, shift: float, div: float):
    """logsigmoid(z + shift) / div for fresh standard normal z, of `like`'s shape and dtype (never above 0)."""
    if _one_pass(like):
        from baselines.perturb_kernels import LOGSIGMOID as MODE

        return _elementwise(like, generator, MODE, shift, 1.0 / div)
    import torch.nn.functional as F

    return (F.logsigmoid(normal_like(like, generator) + shift) / div).to(like.dtype)


def sigmoid_drawn(like, generator):
    """sigmoid(z) for fresh standard normal z, of `like`'s shape and dtype: within (0, 1)."""
    if _one_pass(like):
        from baselines.perturb_kernels import SIGMOID as MODE

        return _elementwise(like, generator, MODE)
    import torch

    return torch.sigmoid(normal_like(like, generator)).to(like.dtype)


def default_perturbed(inputs: dict, generator) -> dict:
    """Every float tensor with relative noise; other values as they are."""
    import torch

    return {k: (relative_noise(v, generator) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
            for k, v in inputs.items()}


def vary_parameter(t, generator):
    """One parameter or buffer scaled and shifted (see the module's docstring); non-float tensors as they are.
    Non-negative tensors (a weight of ones, a running variance, a 0/1 mask) are only scaled: they stay
    non-negative and their zeros stay zeros."""
    import torch

    if not t.is_floating_point() or t.numel() == 0:
        return t
    f = t.float()
    out = f * torch.exp(PARAM_SCALE * normal_like(f, generator))
    nonneg = bool((f >= 0).all())
    if not nonneg or not bool(f.any()):
        rms = float(f.pow(2).mean().sqrt())
        out = out + PARAM_SHIFT * (rms if rms > 0 else 1.0) * normal_like(f, generator)
    return out.to(t.dtype)
