"""Baselines for KDA. This is the ONLY file of the project that imports FLA.

* `fla_chunk_kda`: FLA's Triton `chunk_kda` (fla-core 0.6.0 on the GPU host). FLA_FLASH_KDA is set to "0" before
  the import (otherwise, where the `flash_kda` package is importable, chunk_kda may silently dispatch to
  MoonshotAI's CUTLASS kernel, which is no Triton baseline); the value in force is recorded in `FLA_ENV`.
* `torch_chunked_fp32`: the project's chunked form (oracle.chunked) in fp32. On a machine without CUDA or fla
  it is the primary baseline (spec.baselines()); it is an error-budget stand-in, not a speed baseline.
"""

from __future__ import annotations

import os

#: environment recorded with every FLA number
FLA_ENV: dict[str, str] = {}


def fla_available() -> bool:
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import importlib.util

        return importlib.util.find_spec("fla") is not None
    except Exception:
        return False


def fla_chunk_kda(inputs: dict) -> dict:
    import torch

    if not torch.cuda.is_available() or not inputs["q"].is_cuda:
        raise RuntimeError("fla.chunk_kda needs CUDA tensors and a GPU; on the CPU use 'torch-chunked-fp32'")
    os.environ.setdefault("FLA_FLASH_KDA", "0")
    FLA_ENV["FLA_FLASH_KDA"] = os.environ["FLA_FLASH_KDA"]
    try:
        from fla.ops.kda import chunk_kda
    except ImportError as e:  # pragma: no cover - depends on the host
        raise RuntimeError("fla (fla-core) is not importable on this machine") from e

    h0 = inputs.get("initial_state")
    o, final = chunk_kda(
        inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"],
        scale=inputs["q"].shape[-1] ** -0.5,
        initial_state=h0,
        output_final_state=h0 is not None,
    )
    out = {"o": o}
    if h0 is not None:
        out["final_state"] = final
    return out


def torch_chunked_fp32(inputs: dict) -> dict:
    import torch

    from baselines.kda.oracle import chunked

    o, s = chunked(inputs, dtype=torch.float32, chunk=64)
    out = {"o": o}
    if "initial_state" in inputs:
        out["final_state"] = s
    return out
