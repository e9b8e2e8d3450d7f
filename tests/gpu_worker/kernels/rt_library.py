import torch


def run(inputs, out):
    out["y"].copy_(torch.softmax(inputs["x"], dim=-1))
