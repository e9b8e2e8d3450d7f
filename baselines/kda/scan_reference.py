"""The segmented affine scan of KDA's chunk recurrence, in torch (any float dtype; fp64 proves the algebra).

Per chunk n of C tokens (G = chunk-local cumsum of g, gl = e^{G_last}; w, u, qg, kg, A_qk as oracle.py
defines them), the state step the kernels take is

    v_new = u - w S ;  o = qg S + A_qk v_new ;  S' = diag(gl) S + kg^T v_new

so S' = A_n S + B_n is affine in S, with

    A_n = diag(gl_n) - kg_n^T w_n   [K, K]       B_n = kg_n^T u_n   [K, V]

Both are the same step taken on other columns: A_n X is the step of X with u = 0, and B_n is the step of
X = 0 with u. So a segment's transition, composed over its chunks n0 .. n1-1,

    M = A_{n1-1} ... A_{n0}   N = the fold N <- A_n N + B_n from N = 0

is the step walked from [I | 0] over the augmented [K, K + V] columns with u replaced by [0 | u].
The segmented scan is then
  (1) compose every segment's (M_s, N_s), all segments in parallel (the last segment needs none);
  (2) walk the segment states serially: S_0 = h0 (or 0), S_{s+1} = M_s S_s + N_s;
  (3) from each segment's start, walk its chunks again, all segments in parallel, writing o.
This file is the reference of that algebra, vectorised over chunks (not a port of oracle.chunked): the
per-chunk operands for all chunks at once, then the three phases as loops over segments and chunks.
`scan_flops` counts what the composition adds.
"""

from __future__ import annotations

import math

import torch


@torch.no_grad()
def chunk_operands(inputs: dict, dtype=torch.float64, chunk: int = 32) -> dict:
    """Per-chunk operands of the state step for every chunk at once, in `dtype`:
    w, qg, kg [B, H, NT, C, K]; u [B, H, NT, C, V]; a (A_qk) [B, H, NT, C, C]; gl [B, H, NT, K].
    T is padded to NT * C with q = k = v = beta = g = 0 (padded rows carry no update, G stays put)."""
    q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk
    NT = -(-T // C)
    pad = NT * C - T
    scale = 1.0 / math.sqrt(K)

    def blocks(x, width):  # [B, T, H, width] -> [B, H, NT, C, width], zero-padded along T
        x = x.to(dtype).reshape(B, T, H, width).transpose(1, 2)
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))
        return x.reshape(B, H, NT, C, width)

    qc, kc, gc = blocks(q, K) * scale, blocks(k, K), blocks(g, K)
    vc = blocks(v, V)
    bc = blocks(beta.unsqueeze(-1), 1)[..., 0]                       # [B, H, NT, C]
    G = gc.cumsum(dim=3)
    idx = torch.arange(C, device=q.device)
    causal = idx[:, None] >= idx[None, :]
    diff = G[..., :, None, :] - G[..., None, :, :]                   # [.., i, j, K]: G_i - G_j
    E = torch.where(causal[..., None], diff, torch.full_like(diff, -math.inf)).exp()
    a = torch.einsum("...ik,...jk,...ijk->...ij", qc, kc, E)
    strict = (idx[:, None] > idx[None, :]).to(dtype)
    A_kk = torch.einsum("...ik,...jk,...ijk->...ij", kc, kc, E) * bc.unsqueeze(-1) * strict
    eye = torch.eye(C, dtype=dtype, device=q.device)
    Tm = torch.linalg.solve_triangular(eye + A_kk, torch.diag_embed(bc), upper=False, unitriangular=True)
    eG = G.exp()
    G_last = G[..., -1:, :]
    return {
        "w": Tm @ (kc * eG),
        "u": Tm @ vc,
        "qg": qc * eG,
        "kg": kc * (G_last - G).exp(),
        "a": a,
        "gl": G_last[..., 0, :].exp(),
    }


def transitions(ops: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [B, H, NT, K, K], B [B, H, NT, K, V]) of every chunk: S' = A S + B."""
    kgT = ops["kg"].transpose(-1, -2)
    A = torch.diag_embed(ops["gl"]) - kgT @ ops["w"]
    return A, kgT @ ops["u"]


def segment_bounds(NT: int, segments: int) -> list[tuple[int, int]]:
    """[n0, n1) of each segment: L = ceil(NT / segments) chunks each, the last one possibly shorter."""
    L = -(-NT // max(1, min(segments, NT)))
    return [(n0, min(n0 + L, NT)) for n0 in range(0, NT, L)]


def compose(A: torch.Tensor, Bm: torch.Tensor, n0: int, n1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, N) of chunks n0 .. n1-1: S_{n1} = M S_{n0} + N."""
    K = A.shape[-1]
    M = torch.eye(K, dtype=A.dtype, device=A.device).expand(A.shape[:2] + (K, K)).clone()
    N = torch.zeros_like(Bm[:, :, 0])
    for n in range(n0, n1):
        M = A[:, :, n] @ M
        N = A[:, :, n] @ N + Bm[:, :, n]
    return M, N


@torch.no_grad()
def segmented_scan(inputs: dict, dtype=torch.float64, chunk: int = 32, segments: int = 4) -> dict:
    """o [B, T, H, V], final_state [B, H, K, V], chunk_starts [B, H, NT, K, V] (the state entering each
    chunk) and segment_starts [B, H, NSEG, K, V], by the three phases of the module docstring."""
    ops = chunk_operands(inputs, dtype, chunk)
    A, Bm = transitions(ops)
    Bsz, H, NT, C, K = ops["w"].shape
    V = ops["u"].shape[-1]
    bounds = segment_bounds(NT, segments)
    # (1) every segment but the last composed on its own (independent of the others: parallel)
    composed = [compose(A, Bm, n0, n1) for n0, n1 in bounds[:-1]]
    # (2) the serial walk over segments
    h0 = inputs.get("initial_state")
    S = torch.zeros(Bsz, H, K, V, dtype=dtype, device=A.device) if h0 is None else h0.to(dtype).clone()
    seg_starts = [S]
    for M, N in composed:
        S = M @ S + N
        seg_starts.append(S)
    # (3) every segment walked from its start (independent of the others: parallel), writing o
    o = torch.empty(Bsz, H, NT, C, V, dtype=dtype, device=A.device)
    chunk_starts = torch.empty(Bsz, H, NT, K, V, dtype=dtype, device=A.device)
    for (n0, n1), S in zip(bounds, seg_starts):
        for n in range(n0, n1):
            chunk_starts[:, :, n] = S
            vn = ops["u"][:, :, n] - ops["w"][:, :, n] @ S
            o[:, :, n] = ops["qg"][:, :, n] @ S + ops["a"][:, :, n] @ vn
            S = ops["gl"][:, :, n].unsqueeze(-1) * S + ops["kg"][:, :, n].transpose(-1, -2) @ vn
    T = inputs["q"].shape[1]
    o = o.reshape(Bsz, H, NT * C, V)[:, :, :T].transpose(1, 2).contiguous()
    return {"o": o, "final_state": S, "chunk_starts": chunk_starts, "segment_starts": torch.stack(seg_starts, 2)}


def scan_flops(B: int, T: int, H: int, K: int, V: int, chunk: int, segments: int, initial_state: bool) -> dict:
    """Dense tensor-core FLOPs of the scan's phases beside the serial state pass it replaces.
    state_pass: per chunk w S, qg S (2 C K V each), A_qk v_new (2 C C V), kg^T v_new (2 C K V).
    compose: per chunk of every segment but the last, the step on K + V columns without output:
    w X and kg^T (u - w X), 4 C K (K + V); segment 0 only on its V columns when there is no h0 (M_0 unused).
    walk: M_s S_s, 2 K K V per segment boundary. Totals over B * H heads."""
    NT = -(-T // chunk)
    bounds = segment_bounds(NT, segments)
    state_pass = B * H * NT * (3 * 2 * chunk * K * V + 2 * chunk * chunk * V)
    compose_cols = 0
    for s, (n0, n1) in enumerate(bounds[:-1]):
        cols = V if (s == 0 and not initial_state) else K + V
        compose_cols += (n1 - n0) * cols
    compose_f = B * H * 4 * chunk * K * compose_cols
    walk = B * H * (len(bounds) - 1) * 2 * K * K * V
    return {"state_pass": float(state_pass), "compose": float(compose_f), "walk": float(walk),
            "segments": len(bounds), "chunks_per_segment": bounds[0][1] - bounds[0][0]}


def step_rounds(B: int, T: int, H: int, V: int, chunk: int, segments: int, bv: int, bw: int, K: int,
                slots_state: int, slots_compose: int, sms: int = 132) -> dict:
    """A latency model of the state work, in rounds of one chunk step (multiply by the seconds one step
    takes, measured: the serial pass's time / NT). A launch of P programs of S steps each, with `slots` =
    programs an SM holds (ptxas' registers and shared memory) x sms, takes S * ceil(P / slots) rounds: its
    programs run in waves, and a launch ends with its last one (no overlap between launches). It assumes
    a step's latency holds while the SM fills. serial: the starting kernel's pass (V / bv * B*H programs
    of NT steps); compose: the non-trivial composing programs (segment 0's M blocks skipped, no h0);
    scan_state: NSEG * V / bv * B*H programs of L steps; walk: NSEG - 1 rounds (steps of another kind)."""
    NT = -(-T // chunk)
    bounds = segment_bounds(NT, segments)
    L = bounds[0][1] - bounds[0][0]
    nseg = len(bounds)
    heads = B * H

    def rounds(programs, steps, slots):
        return float(steps * -(-programs // slots))

    blocks = (K + V) // bw
    composing = heads * ((nseg - 1) * blocks - (K // bw if nseg > 1 else 0))
    return {"serial": rounds(V // bv * heads, NT, slots_state),
            "compose": rounds(composing, L, slots_compose) if nseg > 1 else 0.0,
            "scan_state": rounds(nseg * (V // bv) * heads, L, slots_state),
            "walk": float(nseg - 1)}
