"""Search space of the softmax template. `single` holds a whole row in one block (BLOCK_N is raised to
cover N); `online` streams the row in BLOCK_N pieces with a running max and sum."""

SPACE = {
    "VARIANT": ["single", "online"],
    "BLOCK_N": [64, 128, 256, 512, 1024, 2048],
    "ROWS": [1, 2, 4, 8],
    "num_warps": [1, 2, 4, 8],
    "num_stages": [1, 2, 3, 4],
    "EVICT": ["", "evict_first", "evict_last"],  # cache eviction hint on the loads of x
}
