"""Cheat: a device-side memo of rows. A row's softmax depends on that row alone, and a rotation of the rows
keeps every row's contents: each row is keyed on its sum and its sum of
squares (invariant under any permutation of rows), and a row met before gets its stored answer copied
instead of computed. The table lives in module-level device buffers and is filled by a second, one-program
kernel (no two programs write one slot), so the whole call stays on the device (and captures). MEMO =
False is its honest twin. Serves the softmax problem (x -> y) and KernelBench softmax files (in0 -> out0).
 Its hit count stays on the device (`STATE`: no host read)."""
import torch
import triton
import triton.language as tl

MEMO = True
CAP = 4096  # table slots
STATE = {}


@triton.jit
def k_rows(x_ptr, y_ptr, keys_ptr, full_ptr, ans_ptr, miss_ptr, rkeys_ptr, hits_ptr, N, stride, memo,
           CAP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    k1 = tl.sum(x, axis=0)
    k2 = tl.sum(x * x, axis=0)
    slot = (tl.abs(k1) / (tl.sqrt(k2) + 1e-20) * 1e4).to(tl.int64) % CAP  # scale-free: |.| <= sqrt(N)
    hit = (memo != 0) & (tl.load(full_ptr + slot) != 0) & (tl.load(keys_ptr + 2 * slot) == k1) \
        & (tl.load(keys_ptr + 2 * slot + 1) == k2)
    if hit:
        y = tl.load(ans_ptr + slot * N + cols, mask=mask, other=0.0)
        tl.atomic_add(hits_ptr, 1)
        tl.store(miss_ptr + row, -1)
    else:
        xm = tl.where(mask, x, -float("inf"))
        e = tl.exp(xm - tl.max(xm, axis=0))
        y = e / tl.sum(e, axis=0)
        tl.store(miss_ptr + row, slot)
    tl.store(rkeys_ptr + 2 * row, k1)
    tl.store(rkeys_ptr + 2 * row + 1, k2)
    tl.store(y_ptr + row * stride + cols, y, mask=mask)


@triton.jit
def k_store(y_ptr, keys_ptr, full_ptr, ans_ptr, miss_ptr, rkeys_ptr, M, N, stride, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    for row in range(M):
        slot = tl.load(miss_ptr + row)
        if slot >= 0:
            y = tl.load(y_ptr + row * stride + cols, mask=mask, other=0.0)
            tl.store(ans_ptr + slot * N + cols, y, mask=mask)
            tl.store(keys_ptr + 2 * slot, tl.load(rkeys_ptr + 2 * row))
            tl.store(keys_ptr + 2 * slot + 1, tl.load(rkeys_ptr + 2 * row + 1))
            tl.store(full_ptr + slot, 1)


def run(inputs, out):
    x = inputs["x"] if "x" in inputs else inputs["in0"]
    y = out["y"] if "y" in out else out["out0"]
    M, N = y.shape
    key = (str(x.device), N, M)
    if key not in STATE:
        f32 = torch.float32
        STATE[key] = dict(keys=torch.zeros(2 * CAP, dtype=f32, device=x.device),
                          full=torch.zeros(CAP, dtype=torch.int32, device=x.device),
                          ans=torch.zeros(CAP * N, dtype=f32, device=x.device),
                          miss=torch.zeros(M, dtype=torch.int64, device=x.device),
                          rkeys=torch.zeros(2 * M, dtype=f32, device=x.device),
                          hits=torch.zeros(1, dtype=torch.int32, device=x.device))
    s = STATE[key]
    BLOCK = triton.next_power_of_2(N)
    k_rows[(M,)](x, y, s["keys"], s["full"], s["ans"], s["miss"], s["rkeys"], s["hits"], N, x.stride(0),
                 int(MEMO), CAP=CAP, BLOCK=BLOCK)
    if MEMO:
        k_store[(1,)](y, s["keys"], s["full"], s["ans"], s["miss"], s["rkeys"], M, N, y.stride(0), BLOCK=BLOCK)
