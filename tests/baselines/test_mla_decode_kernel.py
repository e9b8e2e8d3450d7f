"""mla_decode starting kernel under the Triton interpreter on shapes the cpu_shape does not reach (whole
tiles, partly masked row blocks and reduction items, the primary shapes' head count and widths with a short
cache), and the fused one-launch design (knob FUSED) against the fp64 oracle on the cpu_shape for every
distribution.

The cpu_shape (S = 100) never divides into whole tiles, so the unmasked hot loop (EVEN) runs only here:
S = 128 with several row blocks (M = 32 rows with BLOCK_H 16) and with one partly masked row block
(M = 24 < BLOCK_H 32). The subprocess helper is test_mla's (TRITON_INTERPRET must be set before triton loads).
Under the interpreter the fused kernel takes its no-barrier path (the last program to arrive reduces every
item); its grid barrier runs only on the GPU (the `gpu`-marked test below).
"""

from __future__ import annotations

import pytest

from baselines.registry import get_problem
from tests.baselines.gpu_kernel_check import assert_passes, check
from tests.baselines.test_mla import _interpret

EVEN_SHAPE = {"Q": 2, "H": 16, "S": 128, "DL": 128, "DR": 16}  # M = 32 rows
EVEN_KNOBS = [
    {"BLOCK_H": 16, "BLOCK_N": 32, "GRID": 8},  # 2 row blocks x 4 splits of one tile, unmasked
    {"BLOCK_H": 64, "BLOCK_N": 16, "GRID": 2, "SPLIT_DV": 2},  # 1 block x 2 dv halves x 1 split of 8 tiles
    {"BLOCK_H": 32, "BLOCK_N": 64, "GRID": 4, "PARTIAL_BF16": True},  # 1 block x 2 splits (GRID capped by tiles)
    # the defaults' SPLIT_DV 2 (own and other latent halves) with splits of >= 2 tiles: 2 x 2 dv x 2 splits
    {"BLOCK_H": 16, "BLOCK_N": 32, "GRID": 64, "MIN_TILES": 2},
    {"BLOCK_H": 32, "BLOCK_N": 16, "GRID": 64, "SPLIT_DV": 1, "MIN_TILES": 4},  # 1 x 1 x 2 splits of 4 tiles
    # fused: 2 row blocks x 4 splits; reduction items of 64 columns, 2 splits per step (2 steps)
    {"FUSED": True, "BLOCK_H": 16, "BLOCK_N": 32, "GRID": 8, "REDUCE_D": 64, "COMBINE_TILE": 128},
    {"FUSED": True, "BLOCK_H": 64, "BLOCK_N": 16, "GRID": 4, "SPLIT_DV": 2},  # 2 dv halves x 2 splits
]
ODD_ROWS_SHAPE = {"Q": 3, "H": 8, "S": 128, "DL": 128, "DR": 16}  # M = 24: a row block partly masked
ODD_ROWS_KNOBS = [{"BLOCK_H": 32, "BLOCK_N": 32, "GRID": 4}, {"BLOCK_H": 16, "BLOCK_N": 64, "GRID": 64},
                  {"FUSED": True, "BLOCK_H": 16, "BLOCK_N": 16, "GRID": 64, "REDUCE_D": 512},
                  {"BLOCK_H": 16, "BLOCK_N": 16, "GRID": 64, "MIN_TILES": 8, "SPLIT_DV": 1},
                  # fused, 2 splits: items of 16 rows, the second item's last 8 rows masked
                  {"FUSED": True, "BLOCK_H": 32, "BLOCK_N": 64, "GRID": 2, "SPLIT_DV": 1, "REDUCE_D": 64,
                   "COMBINE_TILE": 4096},
                  # fused, 4 splits reduced 2 per step (the running max carried across steps)
                  {"FUSED": True, "BLOCK_H": 16, "BLOCK_N": 32, "GRID": 16, "REDUCE_D": 128, "COMBINE_TILE": 256}]

# the fused design on the cpu_shape (S = 100: the last split masked; Q*H = 8 rows), every distribution
FUSED_KNOBS = [
    {"FUSED": True},  # the template's other defaults: one row block, 2 splits of 64 (REDUCE_D capped at DL)
    {"FUSED": True, "BLOCK_H": 16, "BLOCK_N": 16, "GRID": 8},  # 7 splits of one tile, the last one masked
    {"FUSED": True, "BLOCK_H": 16, "BLOCK_N": 16, "GRID": 8, "REDUCE_D": 64, "COMBINE_TILE": 128},  # 4 steps
    {"FUSED": True, "BLOCK_H": 32, "BLOCK_N": 64, "GRID": 1},  # one split: the reduction of a single partial
    {"FUSED": True, "BLOCK_H": 16, "BLOCK_N": 32, "GRID": 8, "SPLIT_DV": 2, "PARTIAL_BF16": True},
]
DISTS = list(get_problem("mla_decode").distributions)

# the primary shapes' head count and widths (H 64, DL 512, DR 64) with a short cache, Q = 1 and 4: the
# defaults' 64-row blocks and 256-column halves at their real sizes; S = 192 splits into whole 64-row tiles,
# S = 100 leaves the last split masked
REAL_DIMS = [{"Q": q, "H": 64, "S": s, "DL": 512, "DR": 64} for q, s in ((1, 192), (4, 100))]
REAL_KNOBS = [{}, {"SPLIT_DV": 1, "num_warps": 8, "BLOCK_N": 32, "num_stages": 4, "MIN_TILES": 2},
              {"BLOCK_H": 128, "num_warps": 8, "BLOCK_N": 32},  # Q4: two 128-row blocks
              # one launch: Q1 3 splits x 2 halves, items of 16 rows x 4 splits (one masked) x 256 columns;
              # Q4 4 blocks x 2 halves x 1 split (GRID 8), items of 64 rows x 2 splits (one masked) x 128 columns
              {"FUSED": True, "REDUCE_D": 256, "COMBINE_TILE": 16384, "BLOCK_N": 64},
              {"FUSED": True, "REDUCE_D": 128, "COMBINE_TILE": 16384, "BLOCK_N": 64, "GRID": 8},
              # 128-key tiles: Q1 2 splits (the second a masked half tile), Q4 one masked tile per split
              {"BLOCK_N": 128, "num_warps": 8, "num_stages": 1}]


@pytest.fixture(scope="module")
def even_results():
    return (_interpret("mla_decode", EVEN_KNOBS, EVEN_SHAPE, ["unit", "peaked"])
            + _interpret("mla_decode", ODD_ROWS_KNOBS, ODD_ROWS_SHAPE, ["peaked"]))


def test_decode_kernel_whole_tiles_interpreter(even_results):
    assert len(even_results) == 2 * len(EVEN_KNOBS) + len(ODD_ROWS_KNOBS)
    for r in even_results:
        assert not r["nan"], r
        assert r["err"] < 1e-5, r  # fp32 throughout on the CPU


def test_fused_kernel_cpu_shape_every_distribution():
    res = _interpret("mla_decode", FUSED_KNOBS)
    assert len(res) == len(FUSED_KNOBS) * len(DISTS)
    assert {r["dist"] for r in res} == set(DISTS)
    for r in res:
        assert not r["nan"], r
        assert r["err"] < 1e-5, r


@pytest.mark.parametrize("shape", REAL_DIMS, ids=[f"Q{s['Q']}-S{s['S']}" for s in REAL_DIMS])
def test_decode_kernel_real_dims_short_cache(shape):
    res = _interpret("mla_decode", REAL_KNOBS, shape, ["peaked"])
    assert len(res) == len(REAL_KNOBS)
    for r in res:
        assert not r["nan"], r
        assert r["err"] < 1e-5, r


@pytest.mark.gpu
@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("idx", [0, 1])
def test_fused_kernel_gpu(idx, dist):
    """The fused design compiled, its grid barrier included, on the primary shapes with the harness's tolerance."""
    assert_passes(check("mla_decode", idx, dist, {"FUSED": True}))
