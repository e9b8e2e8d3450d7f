"""Starting kernel for KDA forward: chunked Triton, two launches, written from the math (docs/problems.md).

Launch 1, `_kda_prep`, one program per (chunk, batch*head), all chunks in parallel. With G = chunk-local cumsum
of g (so every exponent below is bounded by one chunk's decay, never by T):
    A_qk[i,j] = sum_d (scale q_id) k_jd e^{G_id - G_jd}  (j <= i)
    A_kk[i,j] = beta_i sum_d k_id k_jd e^{G_id - G_jd}   (j < i)
    X = (I + A_kk)^-1 ;  w = X (beta * k * e^G) ;  u = X (beta * v)
  and stores w, u, qg = scale q e^G, kg = k e^{G_last - G}, A_qk and e^{G_last} (all exponents <= 0).
  The pairwise decays are never formed per pair. Two factorisations e^{G_i - G_j} = e^{G_i - G_a} e^{G_a - G_j}:
  * "levels" (any gate): a binary split of the chunk. At level b (b = C/2, ..., 1) the pairs with i in the
    upper and j in the lower half of the same 2b-block use anchor a = first row of the upper half, so both
    exponents are <= 0 (only underflow, which is exact enough: the true product is smaller still).
    Every pair j < i lies in exactly one level, so A = sum over log2(C) levels of masked tensor-core products.
  * "fast" (FAST knob; taken per chunk only when max_d (G_0d - G_last,d) <= BOUND): anchor row 0,
    A = (q e^{G - G_0}) (k e^{G_0 - G})^T in one product; the second factor is <= e^BOUND (finite in fp32 and
    bf16), the first <= 1; the upper triangle is discarded with tl.where after the dot. Chunks with a larger
    decay span fall back to the levels path, so the result is safe under any gate.
  A is summed over K blocks of BK channels (the cumsum is per channel), which bounds register use.
  The unit lower-triangular solve: the 16x16 diagonal blocks are inverted together by 15-step forward
  substitution on the [C, C] tile (step s finalises row s of every block), then X = (I + N)^-1 Xd with
  N = Xd L_off nilpotent (N^NC = 0), by a Horner sum of NC - 1 products at SOLVE_PREC. tf32 there costs
  ~3e-5 relative error in w, 50x under the bf16 rounding of w itself; tf32x3 spills.
Launch 2, `_kda_state`, one program per (V block, batch*head), sequential over chunks, fp32 state S [K, BV]:
    v_new = u - w S ;  o = qg S + A_qk v_new ;  S <- diag(e^{G_last}) S + kg^T v_new
Tail chunks (T not a multiple of C) load zeros past T (g = 0 there, so G stays at the last valid row).
"""

import math

import torch
import triton
import triton.language as tl

# The default knobs: the fastest setting a search over this space found on an H200.
KNOBS = {"BK": 128, "BOUND": 40.0, "BV": 16, "CHUNK": 32, "FAST": True, "SOLVE_PREC": "tf32", "num_stages": 4, "num_warps_prep": 4, "num_warps_state": 4}


@triton.jit
def _level(G, q, k, ri, C: tl.constexpr, K: tl.constexpr, HB: tl.constexpr):
    """Pairs (i upper half, j lower half) of each 2*HB-row block, anchored at the upper half's first row:
    e^{G_i - G_j} = e^{G_i - G_a} e^{G_a - G_j}, both exponents <= 0."""
    NB: tl.constexpr = C // (2 * HB)
    G3 = tl.reshape(G, (NB, 2 * HB, K))
    sel = (tl.arange(0, 2 * HB) == HB)[None, :, None]
    ga = tl.sum(tl.where(sel, G3, 0.0), axis=1)                  # [NB, K]: G at each block's anchor row
    Ga = tl.reshape(tl.broadcast_to(ga[:, None, :], (NB, 2 * HB, K)), (C, K))
    upper = (ri % (2 * HB)) >= HB
    F = tl.exp(tl.where(upper[:, None], G - Ga, Ga - G))        # exponent <= 0 on every row
    qa = tl.where(upper[:, None], q * F, 0.0)
    ka = tl.where(upper[:, None], k * F, 0.0)
    kb = tl.where(upper[:, None], 0.0, k * F)
    same = (ri[:, None] // (2 * HB)) == (ri[None, :] // (2 * HB))
    return tl.where(same, tl.dot(qa, tl.trans(kb)), 0.0), tl.where(same, tl.dot(ka, tl.trans(kb)), 0.0)


@triton.jit
def _kda_prep(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,
              w_ptr, u_ptr, qg_ptr, kg_ptr, a_ptr, gl_ptr,
              T, H, NT, scale,
              K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
              FAST: tl.constexpr, BOUND: tl.constexpr, SOLVE_PREC: tl.constexpr):
    n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    NC: tl.constexpr = C // BC
    DT = w_ptr.dtype.element_ty

    ri = tl.arange(0, C)
    t = n * C + ri
    valid = t < T
    m_r = valid[:, None]
    row = (b * T + t) * H + h          # inputs [B, T, H, D]
    mid = bh * T + t                   # intermediates [B, H, T, D]
    causal = ri[:, None] >= ri[None, :]
    strict = ri[:, None] > ri[None, :]

    # ---- A_qk, A_kk: sum over K blocks (channels are independent, so is the cumsum) ---------------------
    a_qk = tl.zeros([C, C], dtype=tl.float32)
    a_kk = tl.zeros([C, C], dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        in_k = row[:, None] * K + rk[None, :]
        g = tl.load(g_ptr + in_k, mask=m_r, other=0.0).to(tl.float32)
        q = tl.load(q_ptr + in_k, mask=m_r, other=0.0).to(tl.float32) * scale
        k = tl.load(k_ptr + in_k, mask=m_r, other=0.0).to(tl.float32)
        G = tl.cumsum(g, axis=0)                                     # chunk-local, <= 0, non-increasing
        G0 = tl.sum(tl.where(ri[:, None] == 0, G, 0.0), axis=0)      # [BK]
        GL = tl.sum(tl.where(ri[:, None] == C - 1, G, 0.0), axis=0)  # last row (padded rows carry g = 0)
        mid_k = mid[:, None] * K + rk[None, :]
        tl.store(qg_ptr + mid_k, (q * tl.exp(G)).to(DT), mask=m_r)
        tl.store(kg_ptr + mid_k, (k * tl.exp(GL[None, :] - G)).to(DT), mask=m_r)
        tl.store(gl_ptr + (bh * NT + n) * K + rk, tl.exp(GL))
        use_fast = False
        if FAST:
            use_fast = tl.max(G0 - GL, axis=0) <= BOUND
        if use_fast:
            F0 = tl.exp(G - G0[None, :])                             # <= 1
            kb = k * tl.exp(G0[None, :] - G)                         # <= e^BOUND
            a_qk += tl.dot(q * F0, tl.trans(kb))                     # upper triangle masked below
            a_kk += tl.dot(k * F0, tl.trans(kb))
        else:
            a_qk += tl.where(ri[:, None] == ri[None, :], tl.sum(q * k, axis=1)[:, None], 0.0)
            if C >= 64:
                s_qk, s_kk = _level(G, q, k, ri, C, BK, 32)
                a_qk += s_qk
                a_kk += s_kk
            s_qk, s_kk = _level(G, q, k, ri, C, BK, 16)
            a_qk += s_qk
            a_kk += s_kk
            s_qk, s_kk = _level(G, q, k, ri, C, BK, 8)
            a_qk += s_qk
            a_kk += s_kk
            s_qk, s_kk = _level(G, q, k, ri, C, BK, 4)
            a_qk += s_qk
            a_kk += s_kk
            s_qk, s_kk = _level(G, q, k, ri, C, BK, 2)
            a_qk += s_qk
            a_kk += s_kk
            s_qk, s_kk = _level(G, q, k, ri, C, BK, 1)
            a_qk += s_qk
            a_kk += s_kk
    a_qk = tl.where(causal, a_qk, 0.0)
    a_kk = tl.where(strict, a_kk, 0.0)
    tl.store(a_ptr + mid[:, None] * C + ri[None, :], a_qk.to(DT), mask=m_r)
    beta = tl.load(beta_ptr + row, mask=valid, other=0.0).to(tl.float32)

    # ---- X = (I + diag(beta) A_kk)^-1 -----------------------------------------------------------------
    L = a_kk * beta[:, None]
    same16 = (ri[:, None] // BC) == (ri[None, :] // BC)
    # Diagonal 16x16 blocks of (I + L)^-1, all blocks at once: step s finalises row s of every block. For
    # column c, rsel picks the row i(c) = 16*(c//16) + s of c's block; as Xd is block-diagonal,
    # sum_j L[i(c), j] Xd[j, c] only sees j in c's block, so one [C] vector serves all blocks.
    Ld = tl.where(same16, L, 0.0)
    Xd = tl.where(ri[:, None] == ri[None, :], 1.0, 0.0)
    for s in range(1, BC):
        rsel = ri[:, None] == (ri[None, :] // BC) * BC + s       # [C, C]: (row i(c), column c)
        li = tl.sum(tl.where(rsel, Ld, 0.0), axis=0)               # li[j] = L[i(j), j]
        contrib = tl.sum(li[:, None] * Xd, axis=0)                 # contrib[c] = sum_j L[i(c), j] Xd[j, c]
        Xd = tl.where(rsel, Xd - contrib[None, :], Xd)
    eye = tl.where(ri[:, None] == ri[None, :], 1.0, 0.0)
    if NC > 1:
        Lo = tl.where(same16, 0.0, L)
        N = tl.dot(Xd, Lo, input_precision=SOLVE_PREC)
        Y = eye - N
        for _i in tl.static_range(NC - 2):
            Y = eye - tl.dot(N, Y, input_precision=SOLVE_PREC)
        X = tl.dot(Y, Xd, input_precision=SOLVE_PREC)
    else:
        X = Xd

    # ---- w = X (beta k e^G), u = X (beta v), by K / V blocks -----------------------------------------------
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        in_k = row[:, None] * K + rk[None, :]
        g = tl.load(g_ptr + in_k, mask=m_r, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + in_k, mask=m_r, other=0.0).to(tl.float32)
        G = tl.cumsum(g, axis=0)
        w = tl.dot(X, k * tl.exp(G) * beta[:, None])
        tl.store(w_ptr + mid[:, None] * K + rk[None, :], w.to(DT), mask=m_r)
    for v0 in range(0, V, BK):
        rv = v0 + tl.arange(0, BK)
        v = tl.load(v_ptr + row[:, None] * V + rv[None, :], mask=m_r, other=0.0).to(tl.float32)
        u = tl.dot(X, v * beta[:, None])
        tl.store(u_ptr + mid[:, None] * V + rv[None, :], u.to(DT), mask=m_r)


@triton.jit
def _kda_state(w_ptr, u_ptr, qg_ptr, kg_ptr, a_ptr, gl_ptr, o_ptr, h0_ptr, ht_ptr,
               T, H, NT,
               K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr,
               HAS_H0: tl.constexpr, HAS_HT: tl.constexpr):
    vb = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    ri = tl.arange(0, C)
    rk = tl.arange(0, K)
    rv = vb * BV + tl.arange(0, BV)
    DT = w_ptr.dtype.element_ty

    s_off = bh * K * V + rk[:, None] * V + rv[None, :]
    if HAS_H0:
        S = tl.load(h0_ptr + s_off).to(tl.float32)
    else:
        S = tl.zeros([K, BV], dtype=tl.float32)
    for n in range(NT):
        t = n * C + ri
        m = (t < T)[:, None]
        mid_k = (bh * T + t)[:, None] * K + rk[None, :]
        mid_v = (bh * T + t)[:, None] * V + rv[None, :]
        w = tl.load(w_ptr + mid_k, mask=m, other=0.0)
        qg = tl.load(qg_ptr + mid_k, mask=m, other=0.0)
        kg = tl.load(kg_ptr + mid_k, mask=m, other=0.0)
        u = tl.load(u_ptr + mid_v, mask=m, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + (bh * T + t)[:, None] * C + ri[None, :], mask=m, other=0.0)
        gl = tl.load(gl_ptr + (bh * NT + n) * K + rk)
        Sd = S.to(DT)
        vn = u - tl.dot(w, Sd)
        vnd = vn.to(DT)
        o = tl.dot(qg, Sd) + tl.dot(a, vnd)
        S = S * gl[:, None] + tl.dot(tl.trans(kg), vnd)
        o_off = ((b * T + t) * H + h)[:, None] * V + rv[None, :]
        tl.store(o_ptr + o_off, o.to(o_ptr.dtype.element_ty), mask=m)
    if HAS_HT:
        tl.store(ht_ptr + s_off, S)


def forward(inputs, out, prep=True, state=True):
    """Both launches; `prep`/`state` False skips one (for timing the parts separately only)."""
    q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
    h0 = inputs.get("initial_state")
    o = out["o"]
    ht = out.get("final_state")
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = KNOBS["CHUNK"]
    BC = 16
    BV = min(KNOBS["BV"], V)
    NT = triton.cdiv(T, C)
    scale = K ** -0.5
    dt = q.dtype
    dev = q.device
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    w = torch.empty(B, H, T, K, dtype=dt, device=dev)
    qg = torch.empty(B, H, T, K, dtype=dt, device=dev)
    kg = torch.empty(B, H, T, K, dtype=dt, device=dev)
    u = torch.empty(B, H, T, V, dtype=dt, device=dev)
    a = torch.empty(B, H, T, C, dtype=dt, device=dev)
    gl = torch.empty(B, H, NT, K, dtype=torch.float32, device=dev)
    if prep:
        _kda_prep[(NT, B * H)](
            q, k, v, g, beta, w, u, qg, kg, a, gl, T, H, NT, scale,
            K=K, V=V, C=C, BC=BC, BK=min(KNOBS["BK"], K), FAST=KNOBS["FAST"], BOUND=KNOBS["BOUND"],
            SOLVE_PREC=KNOBS["SOLVE_PREC"], num_warps=KNOBS["num_warps_prep"], num_stages=1)
    if state:
        _kda_state[(triton.cdiv(V, BV), B * H)](
            w, u, qg, kg, a, gl, o, h0 if h0 is not None else gl, ht if ht is not None else gl,
            T, H, NT, K=K, V=V, C=C, BV=BV, HAS_H0=h0 is not None, HAS_HT=ht is not None,
            num_warps=KNOBS["num_warps_state"], num_stages=KNOBS["num_stages"])


def run(inputs, out):
    forward(inputs, out)
