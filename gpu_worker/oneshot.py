"""Run one candidate a few times under the sandbox guard, for external profilers (ncu):
`python -m gpu_worker.oneshot CANDIDATE.py PROBLEM SHAPE TMPDIR`."""

from __future__ import annotations

import importlib.util
import sys


def main(argv):
    path, problem, shape_name, tmp = argv
    import os

    # no bytecode written beside the candidate's file, which may lie outside the directory the guard allows
    # (a sandbox child's interpreter runs with PYTHONDONTWRITEBYTECODE set for the same reason)
    sys.dont_write_bytecode = True

    # the candidate compiles into its own directory, like a sandbox child: a shared cache it could write
    # would let it plant a kernel binary under another kernel's key; the path is sandbox.candidate_triton_cache(tmp)
    os.environ["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton-cache")
    # the guard lets it write under TMPDIR only, as in a child: Triton's ptx/cubin temp files go there too
    os.makedirs(tmp, exist_ok=True)
    os.environ["TMPDIR"] = tmp
    import tempfile

    tempfile.tempdir = None
    import torch

    from baselines.registry import get_problem
    from gpu_worker import guard, wall

    p = get_problem(problem)
    cuda = torch.cuda.is_available()
    shapes = list(p.shapes) + [p.cpu_shape]
    shape = next((s for s in shapes if s.name == shape_name), p.shapes[0] if cuda else p.cpu_shape)
    dev = "cuda" if cuda else "cpu"
    inputs = {k: (v.to(dev) if hasattr(v, "to") else v)
              for k, v in p.make_inputs(shape, p.distributions[0], 0, "cpu", cpu=not cuda).items()}
    outs = {n: torch.empty(s.shape, dtype=getattr(torch, s.dtype), device=dev)
            for n, s in p.output_specs(shape, cpu=not cuda).items()}
    if cuda:  # what Triton runs once per process (ldconfig, `ptxas --version`), before the guard, as a child does
        from gpu_worker.child.core import _warm_triton

        _warm_triton()
    # the candidate loaded and called as in a sandbox child: Triton readied, each call under the dispatch guard
    from gpu_worker.child.loading import ready_triton
    from gpu_worker.guard import dispatch_guard

    ready_triton(cuda)
    ptxas = wall.compiler_binaries() if cuda else []
    guard.install([tmp], [], allowed_exec=tuple(ptxas),
                  launcher_exec=tuple(wall.c_compiler_programs() if ptxas else ()))
    spec = importlib.util.spec_from_file_location("candidate", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for _ in range(4):
        with dispatch_guard(outputs=outs):
            mod.run(inputs, outs)
    if cuda:
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
