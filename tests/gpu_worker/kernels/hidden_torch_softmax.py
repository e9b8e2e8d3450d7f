"""Cheat (library-kernel, run time): a torch-only softmax written with operators alone (`**`, `-`, `+`,
`/` on tensors, slices, copy_), which no name in the source gives away: the static rules pass it, and
the run-time guard's dispatch allowlist refuses its first computing op (aten::pow)."""


def run(inputs, out):
    x, y = inputs["x"], out["y"]
    shifted = x - x[:, :1]  # any per-row shift keeps softmax's answer
    e = 2.718281828459045 ** shifted
    s = e[:, :1] - e[:, :1]
    for j in range(x.shape[1]):
        s = s + e[:, j:j + 1]
    y.copy_(e / s)
