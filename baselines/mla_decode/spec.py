"""mla_decode: absorbed multi-head latent attention (DeepSeek-V3 MLA), decode step, batch 1.

Math (per query token t and head h; D = DL + DR, DL = latent width, DR = rope width):

    s[t, h, j] = SCALE * <q[t, h, :], kv_cache[j, :]>          (all D columns: latent part + rope part)
    p[t, h, :] = softmax_j(s[t, h, :])                          (over all S cache rows)
    o[t, h, :] = sum_j p[t, h, j] * kv_cache[j, :DL]            (V = the first DL columns of the same row)

The cache is shared by every head (MQA-like), SCALE = 1/sqrt(192) whatever the dims (DeepSeek's
qk_nope + qk_rope = 128 + 64; not 1/sqrt(576), FlashMLA's default for these widths).

Several query tokens (Q > 1, e.g. speculative decode / MTP): every query attends to the *full* cache
(no causal mask among the Q new tokens); the Q tokens are just more rows sharing the same K/V.

Inputs:  q [Q, H, D], kv_cache [S, D]   (bf16 on GPU; fp32 when cpu=True)
Output:  o [Q, H, DL]                   (bf16 on GPU; fp32 when cpu=True)

The rope width is not a tensor dimension of its own: every shape here uses DL = 8 * DR (512 + 64 on the
GPU, 128 + 16 on the CPU), so DL = D - D // 9 (`latent_dim`). Kernels read DL from out["o"].shape[-1].
"""

from __future__ import annotations

from baselines.mla_decode.dims import SCALE, latent_dim
from baselines.problem import OutputSpec, Problem, Shape


#: q's scale per distribution, as mla_inputs draws it (the cache is N(0, 1) in all of them)
Q_SCALE = {"unit": 1.0, "small": 0.1, "peaked": 4.0}


def mla_inputs(problem: str, rows: int, H: int, S: int, DL: int, DR: int, distribution: str, seed: int,
               device: str, cpu: bool) -> dict:
    """q [rows, H, DL+DR] and one latent cache [S, DL+DR] shared by all heads (decode and prefill alike).
    Distributions scale q: `unit`, `small` (/10, FlashMLA's test setting), `peaked` (x4, logits std ~7)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    D = DL + DR
    q = torch.randn(rows, H, D, generator=g, dtype=torch.float32)
    cache = torch.randn(S, D, generator=g, dtype=torch.float32)
    if distribution == "small":
        q = q / 10.0
    elif distribution == "peaked":
        q = q * 4.0
    elif distribution != "unit":
        raise ValueError(f"{problem} has no distribution {distribution!r}")
    dtype = torch.float32 if cpu else torch.bfloat16
    return {"q": q.to(dtype).to(device), "kv_cache": cache.to(dtype).to(device)}


def mla_perturbed(inputs: dict, generator, distribution: str) -> dict:
    """A timed repetition's q and cache (decode and prefill alike): each mixed with fresh normal values at
    its distribution's scale, so the scales stay those `mla_inputs` draws."""
    from baselines.perturb import mixed

    if distribution not in Q_SCALE:
        raise ValueError(f"MLA has no distribution {distribution!r}")
    return {**inputs, "q": mixed(inputs["q"], generator, Q_SCALE[distribution]),
            "kv_cache": mixed(inputs["kv_cache"], generator)}


def _shape(name: str, Q: int, H: int, S: int, DL: int, DR: int) -> Shape:
    assert DL == 8 * DR
    return Shape(name, {"Q": Q, "H": H, "S": S, "DL": DL, "DR": DR})


class MLADecode(Problem):
    name = "mla_decode"
    description = (
        "absorbed MLA decode: q[Q,H,576] against one latent cache[S,576] shared by all heads, "
        "V = cache[:, :512], scale 1/sqrt(192), o[Q,H,512]"
    )
    shapes = [
        _shape("B1 H64 S8192 Q1", 1, 64, 8192, 512, 64),
        _shape("B1 H64 S8192 Q4", 4, 64, 8192, 512, 64),
    ]
    # S = 100 is not a multiple of any block; Q = 2 exercises the several-query path; H*Q = 8 < 16 rows
    cpu_shape = _shape("Q2 H4 S100 DL128 DR16", 2, 4, 100, 128, 16)

    def perturbed(self, inputs, generator, distribution):
        return mla_perturbed(inputs, generator, distribution)

    def random_space(self, cpu):
        # cache lengths that fill no tile or split evenly, every query count the spec serves
        if cpu:
            return {"Q": (1, 3), "S": (37, 129)}
        return {"Q": (1, 2, 3, 4), "S": (1000, 3001, 5555)}
    # unit: q, cache ~ N(0,1) (logits std ~ 1.7); small: q/10 (FlashMLA's test setting, flat softmax);
    # peaked: q*4 (logits std ~ 7: a kernel without the running max overflows / loses precision)
    distributions = ("unit", "small", "peaked")
    tolerance_floor = 1e-4
    tolerance_alpha = 2.0
    outputs = ("o",)

    own_generators = True  # each case from a torch.Generator of its own

    def make_inputs(self, shape, distribution, seed, device, cpu=False):
        return mla_inputs(self.name, shape["Q"], shape["H"], shape["S"], shape["DL"], shape["DR"], distribution,
                          seed, device, cpu)

    def output_specs(self, shape, cpu=False):
        return {"o": OutputSpec((shape["Q"], shape["H"], shape["DL"]), "float32" if cpu else "bfloat16")}

    def oracle(self, inputs):
        from baselines.mla_decode.oracle import mla_decode_fp64

        q, cache = inputs["q"], inputs["kv_cache"]
        return {"o": mla_decode_fp64(q, cache, latent_dim(cache.shape[-1]), SCALE)}

    def baselines(self):
        from baselines.mla_decode.baseline import torch_bmm, torch_bmm_bf16, torch_bmm_fp32

        return {"torch-bmm": torch_bmm, "torch-bmm-bf16scores": torch_bmm_bf16, "torch-bmm-fp32": torch_bmm_fp32}

    # --- roofline -----------------------------------------------------------------------------
    def flops(self, shape):
        """2*Q*H*S*D for the scores (D = DL + DR) + 2*Q*H*S*DL for P @ V; softmax's O(Q*H*S) ignored."""
        Q, H, S, DL, DR = (shape[k] for k in ("Q", "H", "S", "DL", "DR"))
        return 2.0 * Q * H * S * (DL + DR + DL)

    def bytes_moved(self, shape):
        """bf16 (2 B): the cache read once (S*D), q read once (Q*H*D), o written once (Q*H*DL)."""
        Q, H, S, DL, DR = (shape[k] for k in ("Q", "H", "S", "DL", "DR"))
        D = DL + DR
        return 2.0 * (S * D + Q * H * D + Q * H * DL)


PROBLEM = MLADecode()
