"""The fixed numbers of the MLA layout, shared by the spec and the baselines (decode and prefill)."""

from __future__ import annotations

import math

#: softmax scale, fixed: 1/sqrt(qk_nope + qk_rope) = 1/sqrt(128 + 64)
SCALE = 1.0 / math.sqrt(192.0)


def latent_dim(d: int) -> int:
    """DL for a cache row of width d = DL + DR with DL = 8 * DR."""
    if d % 9:
        raise ValueError(f"row width {d} is not DL + DR with DL = 8 * DR")
    return d - d // 9
