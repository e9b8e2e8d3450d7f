"""Not in the contract: a wrong answer (zeros) written by a torch call whose `out=` resizes the harness's
own buffer to the transposed shape. The buffer stays the object it was handed; only its shape changed."""
import torch


def run(inputs, out):
    y = out["y"]
    torch.zeros(y.shape[1], y.shape[0], out=y)
