"""Starting kernel for KDA forward: 16-row sub-chunks, two launches, one path for every gate, written from the
math (docs/problems.md).

Notation per (batch, head) and 16-row sub-chunk: G = cumsum of g within the sub-chunk (so no exponent grows with
T), GL = its last row, qs = scale q. The local WY form of one sub-chunk:
    A_qk[i,j] = sum_d qs_id k_jd e^{G_id - G_jd} (j <= i) ;  L[i,j] = beta_i sum_d k_id k_jd e^{G_id - G_jd} (j < i)
    X = (I + L)^-1 ;  w = X (beta k e^G) ;  u = X (beta v) ;  kg = k e^{GL - G}
With S the state entering the sub-chunk: v_new = u - w S, o = qs e^G S + A_qk v_new, S <- e^{GL} S + kg^T v_new.
The read-out is folded into the operands the state multiplies:
    o = q' S + ou,  q' = qs e^G - A_qk w,  ou = A_qk u
so one product [w; -q'] S gives both v_new and o, and o is off the state's dependency chain.

Launch 1, `_kda_intra`, grid (steps, B*H) (COUPLE "state": sub-chunks), all in parallel. A step is SUB
sub-chunks (the rows the state pass advances at once). Per sub-chunk, from [16, K] tiles (no spills at K = 128:
scripts/offline_compile_kda.py reports registers per setting):
  * A_qk and L as one tensor-core product each, e^{G_i - G_j} = e^{E_i} e^{-E_j} with E a clamped cumsum
    (steps max(g, -CLAMP)) less the midpoint of its range: |E| <= 15 CLAMP / 2 = 85, so no factor overflows
    fp32 (bf16 has the same range) under any gate. A pair with a step below -CLAMP between them has a true
    decay < e^-CLAMP and so has its clamped one: the clamp changes each term by < e^-11.3 = 1.2e-5, far under
    bf16 rounding. Upper-triangle entries of the products may be inf: tl.where discards them after the dot.
  * X by exact block doubling, X_2b = X_b - X_b L_b X_b from the 2 x 2 blocks (3 levels of two products).
  * w, u, q', ou and kg as above (every exponent <= 0).
  With SUB = 2 the second sub-chunk b also couples to the first, a, within the step:
    v_new_b = u_b - (w_b e^{GL_a}) S - M v_new_a ,  M = w_b kg_a^T
    o_b     = (q'_b e^{GL_a}) S + ou_b + N v_new_a ,  N = q'_b kg_a^T
    S      <- e^{GL_a + GL_b} S + (kg_a e^{GL_b})^T v_new_a + kg_b^T v_new_b
  (M and N are products of local, bounded quantities). COUPLE = "prep": one program per step folds the
  coupling into b's operands, v_new_b = (u_b - M u_a) - (w_b e^{GL_a} - M w_a) S and o_b alike, so the state
  pass has no in-step product; COUPLE = "state": one program per sub-chunk (the second reads the first's k
  and g again, from L2) stores M and N, and the state pass applies them to v_new_a. SUB = 4 (COUPLE "prep"
  only) is the same fold by block forward substitution over the step's four sub-chunks, each coupled to the
  coupled rows the program stored for the earlier ones (read back after a barrier).
  Stores, all in the input dtype except gl (fp32), laid out [B*H, sub-chunk, ...] so one step is contiguous:
    wq [.., 2, 16, K] = w, -q' ; uo [.., 2, 16, V] = u, ou ; kg [.., 16, K] ; gl [step, K] = e^{GL of the
    step} ; with COUPLE "state" mn [step, 32, 16] = M, -N.
Launch 2, `_kda_recur`, grid (V/BV, B*H), sequential over steps with the fp32 state S [K, BV] in registers:
    Y = uo - wq S   (one [32 SUB, K] x [K, BV] product: rows v_new and o of each sub-chunk)
    COUPLE "state": Y_b -= [M; -N] v_new_a   (one [32, 16] x [16, BV] product)
    store o ;  S <- gl S + kg^T v_new
  The state never leaves the chip; only o (and the final state) are written.
Bytes at B1 T8192 H32 D128 per token-head: launch 1 reads q, k, v (bf16), g (fp32), beta: 1282 B, writes
w, q', kg, u, ou (bf16): ~1.3 kB; launch 2 reads those back (the K-wide wq and kg once per V block,
from L2 after the first) and writes o. Tensor-core inputs are the input dtype (bf16 on the GPU, fp32 under the
interpreter) with fp32 accumulation, except the solve, w, u, q', ou, M and N when PREP_DOT asks for tf32.
Tail sub-chunks (T not a multiple of 16 SUB) load zeros past T: g = 0 there, so G stays at the last valid row
and every padded row of w, q', u, ou and kg is zero; o stores are masked.
"""


import torch
import triton
import triton.language as tl

# The default knobs (knobs.py says what each one does).
KNOBS = {"BV": 32, "COUPLE": "prep", "PREP_DOT": "mixed", "ROWS": "pad", "SUB": 2, "maxnreg_prep": 0, "num_stages": 2, "num_warps_prep": 4, "num_warps_state": 4}

C = 16                      # rows of a sub-chunk
CLAMP = 170.0 / (C - 1)     # bounds every factor of the diagonal-block products by e^85
LAUNCHED: dict = {}         # the last compiled kernels (register / spill / shared-memory reports)


@triton.jit
def _double(X, L, ri, B: tl.constexpr, SP: tl.constexpr, ST: tl.constexpr):
    """X_2B = X_B - X_B L_B X_B: from the inverses of the B x B diagonal blocks to those of the 2B x 2B ones."""
    sel = ((ri[:, None] // (2 * B)) == (ri[None, :] // (2 * B))) & ((ri[:, None] // B) != (ri[None, :] // B))
    Lb = tl.where(sel, L, 0.0)
    if SP == "input":
        Xh = X.to(ST)
        return X - tl.dot(tl.dot(Xh, Lb.to(ST)).to(ST), Xh)
    else:
        return X - tl.dot(tl.dot(X, Lb, input_precision=SP), X, input_precision=SP)


@triton.jit
def _intra16(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, wq_ptr, uo_ptr, kg_ptr, b, h, s, si, T, H, scale,
             sc_kg, sc_wq,
             K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, CLAMP: tl.constexpr,
             AT: tl.constexpr, WT: tl.constexpr, SP: tl.constexpr, STORE_WU: tl.constexpr):
    """The local WY form of sub-chunk s, stored as soon as each part is ready (so few tiles are live at once)
    at index si of the intermediates: kg * sc_kg, and with STORE_WU wq = (w, -q') * sc_wq and uo = (u, ou)
    (sc_*: [K] decays by which the step scales them). Returns the unscaled (w, -q', u, ou, kg, GL), fp32."""
    ri = tl.arange(0, C)
    rk = tl.arange(0, K)
    rv = tl.arange(0, V)
    ST = wq_ptr.dtype.element_ty
    t = s * C + ri
    valid = t < T
    m = valid[:, None]
    row = (b * T + t) * H + h                                         # inputs [B, T, H, D]
    beta = tl.load(beta_ptr + row, mask=valid, other=0.0).to(tl.float32)
    in_k = row[:, None] * K + rk[None, :]
    g = tl.load(g_ptr + in_k, mask=m, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + in_k, mask=m, other=0.0).to(tl.float32)
    G = tl.cumsum(g, axis=0)                                          # <= 0, non-increasing
    GL = tl.min(G, axis=0)                                            # last row (padded rows carry g = 0)
    kd = ri[:, None] * K + rk[None, :]
    kg = k * tl.exp(GL[None, :] - G)
    tl.store(kg_ptr + si * (C * K) + kd, (kg * sc_kg[None, :]).to(ST))

    # A_qk and L from one factored product each, the anchor at the midpoint of a clamped cumsum
    Gc = tl.cumsum(tl.maximum(g, -CLAMP), axis=0)
    E = Gc - 0.5 * (tl.max(Gc, axis=0) + tl.min(Gc, axis=0))[None, :]
    Fq = tl.exp(E)
    kb = tl.trans((k * tl.exp(-E)).to(AT))
    L = tl.where(ri[:, None] > ri[None, :], tl.dot((k * Fq).to(AT), kb), 0.0) * beta[:, None]
    q = tl.load(q_ptr + in_k, mask=m, other=0.0).to(tl.float32) * scale
    a_qk = tl.where(ri[:, None] >= ri[None, :], tl.dot((q * Fq).to(AT), kb), 0.0)

    # X = (I + L)^-1 by block doubling from the 2 x 2 blocks
    pair = ((ri[:, None] // 2) == (ri[None, :] // 2)) & (ri[:, None] > ri[None, :])
    X = tl.where(ri[:, None] == ri[None, :], 1.0, 0.0) - tl.where(pair, L, 0.0)
    X = _double(X, L, ri, 2, SP, ST)
    X = _double(X, L, ri, 4, SP, ST)
    X = _double(X, L, ri, 8, SP, ST)
    Xd = X.to(WT)
    ad = a_qk.to(WT)

    vd = ri[:, None] * V + rv[None, :]
    uo = uo_ptr + si * (2 * C * V) + vd
    v = tl.load(v_ptr + row[:, None] * V + rv[None, :], mask=m, other=0.0).to(tl.float32)
    u = tl.dot(Xd, (v * beta[:, None]).to(WT))
    ou = tl.dot(ad, u.to(WT))                                          # A_qk u
    if STORE_WU:
        tl.store(uo, u.to(ST))
        tl.store(uo + C * V, ou.to(ST))
    eG = tl.exp(G)
    w = tl.dot(Xd, (k * eG * beta[:, None]).to(WT))
    nq = tl.dot(ad, w.to(WT)) - q * eG                                 # -q'
    if STORE_WU:
        wq = wq_ptr + si * (2 * C * K) + kd
        tl.store(wq, (w * sc_wq[None, :]).to(ST))
        tl.store(wq + C * K, (nq * sc_wq[None, :]).to(ST))
    return w, nq, u, ou, kg, GL


@triton.jit
def _gsum(g_ptr, b, h, s, T, H, K: tl.constexpr, C: tl.constexpr):
    """GL of sub-chunk s: the sum of its g, [K] (0 past T)."""
    t = s * C + tl.arange(0, C)
    off = ((b * T + t) * H + h)[:, None] * K + tl.arange(0, K)[None, :]
    return tl.sum(tl.load(g_ptr + off, mask=(t < T)[:, None], other=0.0).to(tl.float32), axis=0)


@triton.jit
def _kg_local(k_ptr, g_ptr, b, h, s, T, H, K: tl.constexpr, C: tl.constexpr):
    """kg = k e^{GL - G} of sub-chunk s, fp32 [C, K], from its k and g read again."""
    t = s * C + tl.arange(0, C)
    off = ((b * T + t) * H + h)[:, None] * K + tl.arange(0, K)[None, :]
    m = (t < T)[:, None]
    G = tl.cumsum(tl.load(g_ptr + off, mask=m, other=0.0).to(tl.float32), axis=0)
    return tl.load(k_ptr + off, mask=m, other=0.0).to(tl.float32) * tl.exp(tl.min(G, axis=0)[None, :] - G)


@triton.jit
def _kda_intra(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,
               wq_ptr, uo_ptr, kg_ptr, mn_ptr, gl_ptr,
               T, H, NS, scale,
               K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr, CLAMP: tl.constexpr,
               PREP_DOT: tl.constexpr, COUPLE: tl.constexpr):
    s = tl.program_id(0)                                              # sub-chunk (COUPLE "prep": step)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    ST: tl.constexpr = wq_ptr.dtype.element_ty
    # operand dtypes: the A products (AT); the solve, w, u and the folds (WT, SP): input dtype or fp32 (tf32)
    AT: tl.constexpr = tl.float32 if PREP_DOT == "tf32" else ST
    WT: tl.constexpr = tl.float32 if PREP_DOT != "input" else ST
    SP: tl.constexpr = "tf32" if PREP_DOT != "input" else "input"
    ri = tl.arange(0, C)
    rk = tl.arange(0, K)
    step = bh * NS + s // SUB
    si = bh * NS * SUB + s                                            # its index in the intermediates
    if SUB == 1:
        ones = tl.full([K], 1.0, tl.float32)
        _w, _nq, _u, _ou, _kg, GL = _intra16(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, wq_ptr, uo_ptr, kg_ptr, b, h,
                                             s, si, T, H, scale, ones, ones, K, V, C, CLAMP, AT, WT, SP, True)
        tl.store(gl_ptr + step * K + rk, tl.exp(GL))
    elif COUPLE == "prep" and SUB > 2:
        # one program per step, sub-chunk j after sub-chunk j - 1, each coupled to every earlier one i by
        # block forward substitution on the stored (coupled) rows of i, with P_j the decay from the step's start:
        #   W_j = w_j e^{P_j} - sum_i M_ji W_i,  U_j = u_j - sum_i M_ji U_i,  M_ji = (w_j e^{P_j - P_i+1}) kg_i^T
        # and -Q_j, O_j alike with -q'_j; kg_j decays to the step's end. Every factor is <= 1.
        step = bh * NS + s
        s0 = s * SUB
        sa = step * SUB
        rv = tl.arange(0, V)
        ones = tl.full([K], 1.0, tl.float32)
        GLall = tl.zeros([K], dtype=tl.float32)
        for c in tl.static_range(SUB):
            GLall += _gsum(g_ptr, b, h, s0 + c, T, H, K, C)
        P = tl.zeros([K], dtype=tl.float32)
        for j in tl.static_range(SUB):
            GLj = _gsum(g_ptr, b, h, s0 + j, T, H, K, C)
            w, nq, u, ou, _kg, _GL = _intra16(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, wq_ptr, uo_ptr, kg_ptr, b, h,
                                              s0 + j, sa + j, T, H, scale, tl.exp(GLall - P - GLj), ones,
                                              K, V, C, CLAMP, AT, WT, SP, j == 0)
            if j > 0:
                eP = tl.exp(P)[None, :]
                Wj = w * eP
                Qj = nq * eP
                Uj = u
                Oj = ou
                D = tl.zeros([K], dtype=tl.float32)                   # decay from the end of i to the start of j
                for r in range(j):                                    # a loop, not unrolled: few live tiles
                    i = j - 1 - r
                    f = tl.exp(D)[None, :]
                    kgt = tl.trans(_kg_local(k_ptr, g_ptr, b, h, s0 + i, T, H, K, C).to(WT))
                    m_ji = tl.dot((w * f).to(WT), kgt).to(WT)
                    n_ji = tl.dot((nq * f).to(WT), kgt).to(WT)
                    Wi = tl.load(wq_ptr + (sa + i) * (2 * C * K) + ri[:, None] * K + rk[None, :]).to(WT)
                    Ui = tl.load(uo_ptr + (sa + i) * (2 * C * V) + ri[:, None] * V + rv[None, :]).to(WT)
                    Wj -= tl.dot(m_ji, Wi)
                    Qj -= tl.dot(n_ji, Wi)
                    Uj -= tl.dot(m_ji, Ui)
                    Oj -= tl.dot(n_ji, Ui)
                    D += _gsum(g_ptr, b, h, s0 + i, T, H, K, C)
                wq = wq_ptr + (sa + j) * (2 * C * K) + ri[:, None] * K + rk[None, :]
                tl.store(wq, Wj.to(ST))
                tl.store(wq + C * K, Qj.to(ST))
                uo = uo_ptr + (sa + j) * (2 * C * V) + ri[:, None] * V + rv[None, :]
                tl.store(uo, Uj.to(ST))
                tl.store(uo + C * V, Oj.to(ST))
            tl.debug_barrier()                                        # j's rows visible to the later ones' loads
            P += GLj
        tl.store(gl_ptr + step * K + rk, tl.exp(GLall))
    elif COUPLE == "prep":
        # one program per step: the second sub-chunk's rows come out coupled to the first's, so the state
        # pass needs no in-step product (v_new_b = (u_b - M u_a) - (w_b e^{GL_a} - M w_a) S, o_b alike)
        step = bh * NS + s
        sa = step * 2
        t2 = (2 * s + 1) * C + ri
        m2 = (t2 < T)[:, None]
        in2 = ((b * T + t2) * H + h)[:, None] * K + rk[None, :]
        GL2 = tl.sum(tl.load(g_ptr + in2, mask=m2, other=0.0).to(tl.float32), axis=0)
        ones = tl.full([K], 1.0, tl.float32)
        wa, _nqa, ua, _oua, kga, GLa = _intra16(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, wq_ptr, uo_ptr, kg_ptr, b,
                                                h, 2 * s, sa, T, H, scale, tl.exp(GL2), ones,
                                                K, V, C, CLAMP, AT, WT, SP, True)
        wb, nqb, ub, oub, _kgb, GLb = _intra16(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, wq_ptr, uo_ptr, kg_ptr, b,
                                               h, 2 * s + 1, sa + 1, T, H, scale, ones, ones,
                                               K, V, C, CLAMP, AT, WT, SP, False)
        kgt = tl.trans(kga.to(WT))
        m_ba = tl.dot(wb.to(WT), kgt).to(WT)                          # M = w_b kg_a^T
        nn_ba = tl.dot(nqb.to(WT), kgt).to(WT)                        # -N = -q'_b kg_a^T
        gla = tl.exp(GLa)[None, :]
        wa = wa.to(WT)
        ua = ua.to(WT)
        rv = tl.arange(0, V)
        wq = wq_ptr + (sa + 1) * (2 * C * K) + ri[:, None] * K + rk[None, :]
        tl.store(wq, (wb * gla - tl.dot(m_ba, wa)).to(ST))
        tl.store(wq + C * K, (nqb * gla - tl.dot(nn_ba, wa)).to(ST))
        uo = uo_ptr + (sa + 1) * (2 * C * V) + ri[:, None] * V + rv[None, :]
        tl.store(uo, (ub - tl.dot(m_ba, ua)).to(ST))
        tl.store(uo + C * V, (oub - tl.dot(nn_ba, ua)).to(ST))
        tl.store(gl_ptr + step * K + rk, tl.exp(GLa + GLb))
    else:
        # one program per sub-chunk (two per step); the partner p is the other sub-chunk of the step, whose
        # k and g this program reads again (a neighbouring program's, so mostly from L2)
        first = s % 2 == 0
        p = s + 1 - 2 * (s % 2)
        tp = p * C + ri
        in_p = ((b * T + tp) * H + h)[:, None] * K + rk[None, :]
        m_p = (tp < T)[:, None]
        GLp = tl.sum(tl.load(g_ptr + in_p, mask=m_p, other=0.0).to(tl.float32), axis=0)
        glp = tl.exp(GLp)
        # the first's kg decays on through the second; the second's w and q' start after the first's decay
        sc_kg = tl.where(first, glp, 1.0)
        sc_wq = tl.where(first, 1.0, glp)
        w, nq, _u, _ou, _kg, GL = _intra16(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, wq_ptr, uo_ptr, kg_ptr, b, h,
                                           s, si, T, H, scale, sc_kg, sc_wq, K, V, C, CLAMP, AT, WT, SP, True)
        if not first:
            # the coupling to the first through its local kg, recomputed from its k and g
            Gp = tl.cumsum(tl.load(g_ptr + in_p, mask=m_p, other=0.0).to(tl.float32), axis=0)
            kgp = tl.load(k_ptr + in_p, mask=m_p, other=0.0).to(tl.float32) * tl.exp(GLp[None, :] - Gp)
            kgt = tl.trans(kgp.to(WT))
            mn = mn_ptr + step * (2 * C * C) + ri[:, None] * C + ri[None, :]
            tl.store(mn, tl.dot(w.to(WT), kgt).to(ST))                # M = w_b kg_a^T
            tl.store(mn + C * C, tl.dot(nq.to(WT), kgt).to(ST))       # -N = -q'_b kg_a^T
            tl.store(gl_ptr + step * K + rk, tl.exp(GLp + GL))


@triton.jit
def _rows2(Y, C: tl.constexpr, BV: tl.constexpr):
    """[2C, BV] -> its two [C, BV] row blocks."""
    return tl.split(tl.permute(tl.reshape(Y, (2, C, BV)), (1, 2, 0)))


@triton.jit
def _kda_recur(wq_ptr, uo_ptr, kg_ptr, mn_ptr, gl_ptr, o_ptr, h0_ptr, ht_ptr,
               T, H, NS,
               K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr, BV: tl.constexpr,
               ROWS: tl.constexpr, COUPLED: tl.constexpr, HAS_H0: tl.constexpr, HAS_HT: tl.constexpr):
    vb = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    R: tl.constexpr = 2 * C * SUB                                     # rows of wq and uo per step
    rr = tl.arange(0, R)
    rs = tl.arange(0, C * SUB)
    rc = tl.arange(0, C)
    rk = tl.arange(0, K)
    rv = vb * BV + tl.arange(0, BV)
    DT = wq_ptr.dtype.element_ty
    OT = o_ptr.dtype.element_ty
    sub_r = rr // (2 * C)                                             # Y row -> sub-chunk, kind, row
    is_v = ((rr // C) % 2) == 0
    ir = rr % C

    s_off = bh * K * V + rk[:, None] * V + rv[None, :]
    if HAS_H0:
        S = tl.load(h0_ptr + s_off).to(tl.float32)
    else:
        S = tl.zeros([K, BV], dtype=tl.float32)
    for n in range(NS):
        step = bh * NS + n
        wq = tl.load(wq_ptr + step * (R * K) + rr[:, None] * K + rk[None, :])
        uo = tl.load(uo_ptr + step * (R * V) + rr[:, None] * V + rv[None, :]).to(tl.float32)
        gl = tl.load(gl_ptr + step * K + rk)
        if ROWS == "pad":
            # Y's rows stay where they are: kg and [M; -N] are loaded zero-padded to act on the right rows
            kg = tl.load(kg_ptr + step * (C * SUB * K) + (sub_r * C + ir)[:, None] * K + rk[None, :],
                         mask=is_v[:, None], other=0.0)
            Y = uo - tl.dot(wq, S.to(DT))                             # rows: v_new, o per sub-chunk
            if SUB == 2 and not COUPLED:
                mn = tl.load(mn_ptr + step * (2 * C * C) + (rr - 2 * C)[:, None] * C + rr[None, :],
                             mask=(rr >= 2 * C)[:, None] & (rr < C)[None, :], other=0.0)
                Y = Y - tl.dot(mn, Y.to(DT))                          # b's rows -= [M; -N] v_new_a
            t = n * (C * SUB) + sub_r * C + ir
            o_off = ((b * T + t) * H + h)[:, None] * V + rv[None, :]
            tl.store(o_ptr + o_off, Y.to(OT), mask=((~is_v) & (t < T))[:, None])
            vn = Y
        else:
            # Y split into [C, BV] row blocks
            kg = tl.load(kg_ptr + step * (C * SUB * K) + rs[:, None] * K + rk[None, :])
            Y = uo - tl.dot(wq, S.to(DT))
            t = n * (C * SUB) + rc
            o_row = ((b * T + t) * H + h)[:, None] * V + rv[None, :]
            if SUB == 1:
                vn, o = _rows2(Y, C, BV)
                tl.store(o_ptr + o_row, o.to(OT), mask=(t < T)[:, None])
            else:
                # Y rows (sub-chunk, kind, row): v_new and o of sub-chunks a and b
                VN, O = tl.split(tl.permute(tl.reshape(Y, (2, 2, C, BV)), (2, 3, 0, 1)))
                va, vnb = tl.split(VN)
                oa, ob = tl.split(O)
                if not COUPLED:
                    mn = tl.load(mn_ptr + step * (2 * C * C) + tl.arange(0, 2 * C)[:, None] * C + rc[None, :])
                    xm, xn = _rows2(tl.dot(mn, va.to(DT)), C, BV)     # M v_new_a, -N v_new_a
                    vnb = vnb - xm
                    ob = ob - xn
                tl.store(o_ptr + o_row, oa.to(OT), mask=(t < T)[:, None])
                tl.store(o_ptr + o_row + C * H * V, ob.to(OT), mask=(t + C < T)[:, None])
                vn = tl.reshape(tl.permute(tl.join(va, vnb), (2, 0, 1)), (2 * C, BV))
        S = S * gl[:, None] + tl.dot(tl.trans(kg), vn.to(DT))
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
    SUB = KNOBS["SUB"]
    if SUB not in (1, 2, 4) or (SUB == 4 and (KNOBS["COUPLE"], KNOBS["ROWS"]) != ("prep", "pad")):
        raise ValueError(f"SUB={SUB} must be 1, 2 or 4, and 4 needs COUPLE prep and ROWS pad")
    BV = min(KNOBS["BV"], V)
    NS = triton.cdiv(T, C * SUB)                                      # steps of the state pass
    dt = q.dtype
    dev = q.device
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    wq = torch.empty(B * H, NS * SUB, 2, C, K, dtype=dt, device=dev)
    uo = torch.empty(B * H, NS * SUB, 2, C, V, dtype=dt, device=dev)
    kg = torch.empty(B * H, NS * SUB, C, K, dtype=dt, device=dev)
    COUPLE = KNOBS["COUPLE"] if SUB > 1 else "state"
    mn = torch.empty(B * H, NS, 2, C, C, dtype=dt, device=dev) if COUPLE == "state" and SUB > 1 else kg
    gl = torch.empty(B * H, NS, K, dtype=torch.float32, device=dev)
    if prep:
        LAUNCHED["intra"] = _kda_intra[(NS if COUPLE == "prep" else NS * SUB, B * H)](
            q, k, v, g, beta, wq, uo, kg, mn, gl, T, H, NS, K ** -0.5,
            K=K, V=V, C=C, SUB=SUB, CLAMP=CLAMP, PREP_DOT=KNOBS["PREP_DOT"], COUPLE=COUPLE,
            num_warps=KNOBS["num_warps_prep"], num_stages=1,
            **({"maxnreg": KNOBS["maxnreg_prep"]} if KNOBS["maxnreg_prep"] else {}))
    if state:
        LAUNCHED["recur"] = _kda_recur[(triton.cdiv(V, BV), B * H)](
            wq, uo, kg, mn, gl, o, h0 if h0 is not None else gl, ht if ht is not None else gl,
            T, H, NS, K=K, V=V, C=C, SUB=SUB, BV=BV, ROWS=KNOBS["ROWS"], COUPLED=COUPLE == "prep",
            HAS_H0=h0 is not None, HAS_HT=ht is not None,
            num_warps=KNOBS["num_warps_state"], num_stages=KNOBS["num_stages"])


def run(inputs, out):
    forward(inputs, out)
