"""Search space of the axpy template."""

SPACE = {"BLOCK": [64, 128, 256, 512, 1024], "num_warps": [1, 2, 4, 8]}
