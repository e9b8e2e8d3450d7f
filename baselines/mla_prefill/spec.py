"""mla_prefill: absorbed MLA over a causal prefill of N tokens, batch 1, one latent cache shared by all heads.

Math (query token i, head h; D = DL + DR; S = N cache rows, cache row j belongs to token j):

    s[i, h, j] = SCALE * <q[i, h, :], kv_cache[j, :]>        for j <= i (causal), -inf otherwise
    o[i, h, :] = softmax_j(s[i, h, :]) @ kv_cache[:, :DL]      (V = the first DL columns of the same row)

SCALE = 1/sqrt(192), as in mla_decode. This is the absorbed ("data-movement friendly") form run at
prefill size: it is compute-bound (4.67 TFLOP at N = 8192, H = 64) -- vLLM/FlashInfer run prefill in the
non-absorbed MHA form instead (3.1x fewer FLOPs); here the absorbed form is the problem by definition.

Inputs:  q [N, H, D], kv_cache [N, D]  (bf16 on GPU; fp32 when cpu=True)
Output:  o [N, H, DL]                  (bf16 on GPU; fp32 when cpu=True)
As in mla_decode, DL = 8 * DR, so DL = D - D // 9.
"""

from __future__ import annotations

from baselines.mla_decode.spec import SCALE, latent_dim, mla_inputs, mla_perturbed
from baselines.problem import OutputSpec, Problem, Shape


def _shape(name: str, N: int, H: int, DL: int, DR: int) -> Shape:
    assert DL == 8 * DR
    return Shape(name, {"N": N, "H": H, "DL": DL, "DR": DR})


class MLAPrefill(Problem):
    name = "mla_prefill"
    description = (
        "absorbed MLA causal prefill: q[N,H,576], latent cache[N,576] shared by all heads, query i sees "
        "rows 0..i, V = cache[:, :512], scale 1/sqrt(192), o[N,H,512]"
    )
    shapes = [_shape("B1 H64 N8192 causal", 8192, 64, 512, 64)]
    # N = 48 is not a multiple of 32 or 64; the diagonal blocks and the tail are both exercised
    cpu_shape = _shape("N48 H2 DL128 DR16", 48, 2, 128, 16)

    def perturbed(self, inputs, generator, distribution):
        return mla_perturbed(inputs, generator, distribution)

    def random_space(self, cpu):
        # sequence lengths that fill no tile: a tail block on the causal diagonal
        if cpu:
            return {"N": (24, 40)}
        return {"N": (1000, 1500, 2500)}
    distributions = ("unit", "small", "peaked")
    tolerance_floor = 1e-4
    tolerance_alpha = 2.0
    outputs = ("o",)

    own_generators = True  # each case from a torch.Generator of its own

    def make_inputs(self, shape, distribution, seed, device, cpu=False):
        # query i attends to cache rows 0..i: as many cache rows as queries
        return mla_inputs(self.name, shape["N"], shape["H"], shape["N"], shape["DL"], shape["DR"], distribution,
                          seed, device, cpu)

    def output_specs(self, shape, cpu=False):
        return {"o": OutputSpec((shape["N"], shape["H"], shape["DL"]), "float32" if cpu else "bfloat16")}

    def oracle(self, inputs):
        from baselines.mla_prefill.oracle import mla_prefill_fp64

        q, cache = inputs["q"], inputs["kv_cache"]
        return {"o": mla_prefill_fp64(q, cache, latent_dim(cache.shape[-1]), SCALE)}

    def baselines(self):
        from baselines.mla_prefill.baseline import torch_reference, torch_sdpa

        return {"torch-ref": torch_reference, "torch-sdpa": torch_sdpa}

    # --- roofline -----------------------------------------------------------------------------
    def flops(self, shape):
        """Causal pairs N(N+1)/2, each 2*H*(D + DL) FLOPs (scores over D, P @ V over DL)."""
        N, H, DL, DR = (shape[k] for k in ("N", "H", "DL", "DR"))
        return 2.0 * H * (DL + DR + DL) * (N * (N + 1) / 2)

    def bytes_moved(self, shape):
        """bf16 (2 B): cache N*D + q N*H*D read once, o N*H*DL written once."""
        N, H, DL, DR = (shape[k] for k in ("N", "H", "DL", "DR"))
        D = DL + DR
        return 2.0 * (N * D + N * H * D + N * H * DL)


PROBLEM = MLAPrefill()
