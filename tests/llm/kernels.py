"""Real Triton kernels for the scripted model: the softmax template at chosen knobs (the synthetic
evaluator times them by their knobs), plus a marker so tests can prove sources stay out of history."""

from __future__ import annotations

from baselines.registry import get_problem

MARKER = "# scripted-llm-kernel"


def softmax_kernel(**knobs) -> str:
    src = get_problem("softmax").render(knobs)
    return src.replace('"""Starting kernel for softmax', f'{MARKER}\n"""Kernel for softmax', 1)


# slower to faster under synthetic_ms (tests/evaluators.py)
LADDER = [
    dict(BLOCK_N=64, num_warps=1),
    dict(BLOCK_N=128, num_warps=2),
    dict(BLOCK_N=128, num_warps=4),
    dict(BLOCK_N=256, num_warps=4),
    dict(BLOCK_N=256, num_warps=8),
    dict(BLOCK_N=512, num_warps=4),
    dict(BLOCK_N=512, num_warps=8),
    dict(BLOCK_N=1024, num_warps=4),
    dict(BLOCK_N=1024, num_warps=8),
    dict(BLOCK_N=1024, num_warps=8, VARIANT="single"),
    dict(BLOCK_N=1024, num_warps=8, VARIANT="single", ROWS=2),
    dict(BLOCK_N=512, num_warps=8, VARIANT="single", ROWS=2),
]
