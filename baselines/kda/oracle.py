"""References for KDA, written from the math (the delta-rule recurrence and its chunked form), not from FLA code.

`chunked`, in float64: the oracle (`KDA.oracle`). The chunked (WY/UT) form in any float dtype; fp64 for the
oracle, fp32 for the CPU baseline. Per chunk of C tokens, G = chunk-local cumsum of g; every e^{G_i - G_j} is
computed per pair with the exponent masked to j <= i before exp (so exponents are <= 0: no overflow under
any gate):

    A_kk[i,j] = beta_i sum_d k_id k_jd e^{G_id - G_jd}   (j < i)
    A_qk[i,j] = sum_d (scale q_id) k_jd e^{G_id - G_jd}  (j <= i)
    T = (I + A_kk)^-1 diag(beta) ;  w = T (e^G * k) ;  u = T v
    v_new = u - w S ;  o = (scale q * e^G) S + A_qk v_new ;  S <- diag(e^{G_last}) S + (e^{G_last - G} * k)^T v_new

Its cost is B*H*C*C*K elements per chunk for the pairwise exponent tensor (memory-heavy but exact) and about
20 tensor ops per chunk: at B1 T8192 H32 that is ~2,600 launches, where the recurrence below makes ~65,000.
That is why it is the oracle: the worker computes its oracles while candidates compile on every core, where
a launch-bound loop is slowed by every other process. In fp64 the two forms agree to ~1e-15
(tests/baselines/test_kda.py, at the CPU test shapes and, gpu-marked, at the primary shape).

`recurrent_fp64`: the oracle's oracle, the definition itself. Token-by-token recurrence in float64 (state S
fp64), vectorised over B and H, a Python loop over T only, so it runs on CUDA tensors too:

    S <- diag(exp(g_t)) S ;  S <- S + beta_t k_t (v_t - S^T k_t)^T ;  o_t = S^T (scale q_t)

A one-step test checks it against the formula worked out by hand, and the chunked form is tested against it.
The CUDA versions need B*H*K*V*8 bytes of state (4 MB at H32 D128) plus the fp64 copies of the inputs (~10 GB
at B1 T32768 H32: use moderate T there).
"""

from __future__ import annotations

import math

import torch


def _to_bhtd(x: torch.Tensor, dtype) -> torch.Tensor:
    """[B, T, H, D] -> [B, H, T, D] in dtype (a copy)."""
    return x.to(dtype).transpose(1, 2).contiguous()


def _unpack(inputs: dict, dtype):
    q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
    scale = inputs.get("scale", 1.0 / math.sqrt(q.shape[-1]))
    B, T, H, K = q.shape
    V = v.shape[-1]
    h0 = inputs.get("initial_state")
    S = torch.zeros(B, H, K, V, dtype=dtype, device=q.device) if h0 is None else h0.to(dtype).clone()
    return (
        _to_bhtd(q, dtype) * scale,
        _to_bhtd(k, dtype),
        _to_bhtd(v, dtype),
        _to_bhtd(g, dtype),
        beta.to(dtype).transpose(1, 2).contiguous(),  # [B, H, T]
        S,
    )


@torch.no_grad()
def recurrent_fp64(inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [B, T, H, V] fp64, final state [B, H, K, V] fp64) by the token-by-token recurrence."""
    q, k, v, g, beta, S = _unpack(inputs, torch.float64)
    B, H, T, K = q.shape
    o = torch.empty(B, H, T, v.shape[-1], dtype=torch.float64, device=q.device)
    for t in range(T):
        S = S * g[:, :, t].exp().unsqueeze(-1)                      # diag(e^{g_t}) S
        kt = k[:, :, t]                                              # [B, H, K]
        pred = torch.einsum("bhk,bhkv->bhv", kt, S)                  # S^T k_t
        delta = (v[:, :, t] - pred) * beta[:, :, t].unsqueeze(-1)    # beta_t (v_t - S^T k_t)
        S = S + kt.unsqueeze(-1) * delta.unsqueeze(-2)               # + k_t delta^T
        o[:, :, t] = torch.einsum("bhk,bhkv->bhv", q[:, :, t], S)   # S^T (scale q_t)
    return o.transpose(1, 2).contiguous(), S


@torch.no_grad()
def chunked(inputs: dict, dtype=torch.float64, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [B, T, H, V], final state [B, H, K, V]) in `dtype` by the chunked WY/UT form; any T (tail chunk)."""
    q, k, v, g, beta, S = _unpack(inputs, dtype)
    B, H, T, K = q.shape
    V = v.shape[-1]
    o = torch.empty(B, H, T, V, dtype=dtype, device=q.device)
    for c0 in range(0, T, chunk):
        c1 = min(c0 + chunk, T)
        L = c1 - c0
        qc, kc, vc, bc = q[:, :, c0:c1], k[:, :, c0:c1], v[:, :, c0:c1], beta[:, :, c0:c1]
        G = g[:, :, c0:c1].cumsum(dim=2)                             # chunk-local cumulative log decay
        idx = torch.arange(L, device=q.device)
        causal = idx[:, None] >= idx[None, :]                        # j <= i
        diff = G[:, :, :, None, :] - G[:, :, None, :, :]             # [B, H, i, j, K]: G_i - G_j
        E = torch.where(causal[:, :, None], diff, torch.full_like(diff, -math.inf)).exp()
        A_qk = torch.einsum("bhik,bhjk,bhijk->bhij", qc, kc, E)
        strict = (idx[:, None] > idx[None, :]).to(dtype)
        A_kk = torch.einsum("bhik,bhjk,bhijk->bhij", kc, kc, E) * bc.unsqueeze(-1) * strict
        eye = torch.eye(L, dtype=dtype, device=q.device)
        Tm = torch.linalg.solve_triangular(eye + A_kk, torch.diag_embed(bc), upper=False, unitriangular=True)
        eG = G.exp()
        w = Tm @ (kc * eG)
        u = Tm @ vc
        v_new = u - w @ S
        o[:, :, c0:c1] = (qc * eG) @ S + A_qk @ v_new
        G_last = G[:, :, -1:]                                        # [B, H, 1, K]
        S = S * G_last.transpose(-1, -2).exp() + (kc * (G_last - G).exp()).transpose(-1, -2) @ v_new
    return o.transpose(1, 2).contiguous(), S
