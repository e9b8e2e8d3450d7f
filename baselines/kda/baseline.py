"""Baselines for KDA. This is the ONLY file of the project that imports FLA.

* `fla_chunk_kda`: FLA's Triton `chunk_kda` (fla-core 0.6.0 on the GPU host). FLA_FLASH_KDA is set to "0" before
  the import (otherwise, where the `flash_kda` package is importable, chunk_kda may silently dispatch to
  MoonshotAI's CUTLASS kernel, which is no Triton baseline); the value in force is recorded in `FLA_ENV`.
  Before its first call, FLA's autotuners are seeded with the choices shipped for this GPU model in
  `autotune/` (baselines.autotune_choices; `scripts/fla_autotune.py` captures and checks them), so that an
  empty host compiles the chosen configs only; what was used is recorded in `FLA_ENV` too.
* `torch_chunked_fp32`: the project's chunked form (oracle.chunked) in fp32. On a machine without CUDA or fla
  it is the primary baseline (spec.baselines()); it is an error-budget stand-in, not a speed baseline.
"""

from __future__ import annotations

import os
from pathlib import Path

#: environment recorded with every FLA number
FLA_ENV: dict[str, str] = {}

#: the autotuning choices shipped per GPU model (baselines.autotune_choices documents)
CHOICES_DIR = Path(__file__).resolve().parent / "autotune"


def fla_available() -> bool:
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import importlib.util

        return importlib.util.find_spec("fla") is not None
    except Exception:
        return False


def fla_versions() -> dict[str, str]:
    """What FLA's autotuning choices depend on: the GPU model, Triton's and FLA's versions."""
    import importlib.metadata

    import torch
    import triton

    try:
        fla = importlib.metadata.version("fla-core")
    except importlib.metadata.PackageNotFoundError:  # a source checkout on the path
        import fla as package

        fla = package.__version__
    return {"gpu": torch.cuda.get_device_name(0), "triton": triton.__version__, "fla": fla}


def seed_shipped_choices(path: Path | None = None) -> str:
    """Seeds FLA's autotuners with the choices shipped for this GPU model (or those at `path`), once a
    process (later calls only report); what happened, as recorded in FLA_ENV["autotune"]. Never raises:
    whatever goes wrong here leaves FLA to autotune, as it would without the choices."""
    if "autotune" not in FLA_ENV:
        from baselines import autotune_choices as choices

        try:
            versions = fla_versions()
            path = path or CHOICES_DIR / choices.gpu_file_name(versions["gpu"])
            doc = choices.read(path)
            if doc is None:
                said = f"autotuned here: no choices shipped for {versions['gpu']}"
            else:
                done = choices.seed(doc, "fla", versions)
                said = (f"autotuned here: {path.name} not used ({done.refused})" if done.refused else
                        f"{done.used} shipped choices from {path.name} ({done.skipped} passed over)")
        except Exception as e:  # noqa: BLE001 - the choices only ever save time
            said = f"autotuned here: the shipped choices not read ({type(e).__name__}: {e})"
        FLA_ENV["autotune"] = said
    return FLA_ENV["autotune"]


def fla_chunk_kda(inputs: dict, shipped_choices: bool = True) -> dict:
    """`shipped_choices=False` leaves FLA to autotune (how the shipped choices are captured)."""
    import torch

    if not torch.cuda.is_available() or not inputs["q"].is_cuda:
        raise RuntimeError("fla.chunk_kda needs CUDA tensors and a GPU; on the CPU use 'torch-chunked-fp32'")
    os.environ.setdefault("FLA_FLASH_KDA", "0")
    FLA_ENV["FLA_FLASH_KDA"] = os.environ["FLA_FLASH_KDA"]
    try:
        from fla.ops.kda import chunk_kda
    except ImportError as e:  # pragma: no cover - depends on the host
        raise RuntimeError("fla (fla-core) is not importable on this machine") from e
    if shipped_choices:
        seed_shipped_choices()

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
