"""Cheat: a device-side memo of whole calls keyed on a cheap sample of the input (SAMPLE elements spread
over it): a call whose sample matches a stored one gets that call's answer copied. It hits whenever an
input set comes back, as from a small pool of timing sets. The table (8 calls) lives in module-level
device buffers; everything stays on the device (and captures). MEMO = False is its honest twin. Serves the
softmax problem (x -> y) and KernelBench softmax files (in0 -> out0). Its hit count stays on the device
(`STATE`: no host read)."""
import torch
import triton
import triton.language as tl

MEMO = True
SLOTS = 8
SAMPLE = 64
STATE = {}


@triton.jit
def k_lookup(x_ptr, keys_ptr, full_ptr, flag_ptr, next_ptr, hits_ptr, total, step, memo, SLOTS: tl.constexpr,
             SAMPLE: tl.constexpr):
    i = tl.arange(0, SAMPLE)
    s = tl.load(x_ptr + i * step, mask=i * step < total, other=0.0)
    k1 = tl.sum(s, axis=0)
    k2 = tl.sum(s * (i + 1).to(tl.float32), axis=0)
    j = tl.arange(0, SLOTS)
    match = (tl.load(full_ptr + j) != 0) & (tl.load(keys_ptr + 2 * j) == k1) & (tl.load(keys_ptr + 2 * j + 1) == k2)
    found = tl.max(tl.where(match, j, -1), axis=0)
    if (memo != 0) & (found >= 0):
        tl.store(flag_ptr, found)
        tl.atomic_add(hits_ptr, 1)
    else:
        nxt = tl.load(next_ptr)
        tl.store(flag_ptr, -1 - nxt)  # a miss: the answer goes to slot nxt
        tl.store(keys_ptr + 2 * nxt, k1)
        tl.store(keys_ptr + 2 * nxt + 1, k2)
        tl.store(full_ptr + nxt, 1)
        tl.store(next_ptr, (nxt + 1) % SLOTS)


@triton.jit
def k_rows(x_ptr, y_ptr, ans_ptr, flag_ptr, M, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    flag = tl.load(flag_ptr)
    if flag >= 0:
        y = tl.load(ans_ptr + flag * M * N + row * N + cols, mask=mask, other=0.0)
    else:
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
        e = tl.exp(x - tl.max(x, axis=0))
        y = e / tl.sum(e, axis=0)
        tl.store(ans_ptr + (-1 - flag) * M * N + row * N + cols, y, mask=mask)
    tl.store(y_ptr + row * stride + cols, y, mask=mask)


def run(inputs, out):
    x = inputs["x"] if "x" in inputs else inputs["in0"]
    y = out["y"] if "y" in out else out["out0"]
    M, N = y.shape
    key = (str(x.device), M, N)
    if key not in STATE:
        STATE[key] = dict(keys=torch.zeros(2 * SLOTS, dtype=torch.float32, device=x.device),
                          full=torch.zeros(SLOTS, dtype=torch.int32, device=x.device),
                          ans=torch.zeros(SLOTS * M * N, dtype=torch.float32, device=x.device),
                          flag=torch.zeros(1, dtype=torch.int32, device=x.device),
                          next=torch.zeros(1, dtype=torch.int32, device=x.device),
                          hits=torch.zeros(1, dtype=torch.int32, device=x.device))
    s = STATE[key]
    total = M * N
    k_lookup[(1,)](x, s["keys"], s["full"], s["flag"], s["next"], s["hits"], total, max(1, total // SAMPLE),
                   int(MEMO), SLOTS=SLOTS, SAMPLE=SAMPLE)
    k_rows[(M,)](x, y, s["ans"], s["flag"], M, N, x.stride(0), BLOCK=triton.next_power_of_2(N))
