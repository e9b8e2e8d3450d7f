"""Compile one Triton kernel for sm_90 without a GPU and report what ptxas says of it: shared memory,
registers, spills, and whether wgmma and cp.async were emitted (the mla_* offline_compile scripts)."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path


def compile_sm90(fn, sig: dict, consts: dict, knobs: dict) -> dict:
    """`sig` names every non-constexpr argument's type; the pointers and integers are taken as divisible by
    16, as the launcher reports them at the problems' primary shapes (aligned pointers, sizes of 64s)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    sig = {**sig, **{k: "constexpr" for k in consts}}
    aligned = [fn.arg_names.index(n) for n, t in sig.items() if t not in ("constexpr", "fp32")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    try:
        k = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": knobs["num_warps"], "num_stages": knobs["num_stages"]})
    except Exception as e:  # noqa: BLE001 - over the shared-memory limit and the like: a row of its own
        return {"knobs": knobs, "error": f"{type(e).__name__}: {e}"[:200]}
    ptx = k.asm["ptx"]
    with tempfile.TemporaryDirectory() as d:
        src = Path(d, "k.ptx")
        src.write_text(ptx)
        out = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", str(src), "-o", str(src) + ".o"],
                             capture_output=True, text=True)
    text = out.stderr + out.stdout
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return {"knobs": knobs, "smem": k.metadata.shared, "regs": int(regs.group(1)) if regs else None,
            "spill_st_ld": [int(spills.group(1)), int(spills.group(2))] if spills else None,
            "wgmma": "wgmma.mma_async" in ptx, "cp_async": "cp.async" in ptx}
