"""mla_decode starting kernel under the Triton interpreter on shapes the cpu_shape does not reach.

The cpu_shape (S = 100) never divides into whole tiles, so the unmasked hot loop (EVEN) runs only here:
S = 128 with several row blocks (M = 32 rows with BLOCK_H 16) and with one partly masked row block
(M = 24 < BLOCK_H 32). The subprocess helper is test_mla's (TRITON_INTERPRET must be set before triton loads).
"""

from __future__ import annotations

import pytest

from tests.baselines.test_mla import _interpret

EVEN_SHAPE = {"Q": 2, "H": 16, "S": 128, "DL": 128, "DR": 16}  # M = 32 rows
EVEN_KNOBS = [
    {"BLOCK_H": 16, "BLOCK_N": 32, "GRID": 8},  # 2 row blocks x 4 splits of one tile, unmasked
    {"BLOCK_H": 64, "BLOCK_N": 16, "GRID": 2, "SPLIT_DV": 2},  # 1 block x 2 dv halves x 1 split of 8 tiles
    {"BLOCK_H": 32, "BLOCK_N": 64, "GRID": 4, "PARTIAL_BF16": True},  # 1 block x 2 splits (GRID capped by tiles)
]
ODD_ROWS_SHAPE = {"Q": 3, "H": 8, "S": 128, "DL": 128, "DR": 16}  # M = 24: a row block partly masked
ODD_ROWS_KNOBS = [{"BLOCK_H": 32, "BLOCK_N": 32, "GRID": 4}, {"BLOCK_H": 16, "BLOCK_N": 64, "GRID": 64}]


@pytest.fixture(scope="module")
def even_results():
    return (_interpret("mla_decode", EVEN_KNOBS, EVEN_SHAPE, ["unit", "peaked"])
            + _interpret("mla_decode", ODD_ROWS_KNOBS, ODD_ROWS_SHAPE, ["peaked"]))


def test_decode_kernel_whole_tiles_interpreter(even_results):
    assert len(even_results) == 2 * len(EVEN_KNOBS) + len(ODD_ROWS_KNOBS)
    for r in even_results:
        assert not r["nan"], r
        assert r["err"] < 1e-5, r  # fp32 throughout on the CPU
