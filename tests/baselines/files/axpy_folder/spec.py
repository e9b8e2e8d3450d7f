"""axpy: y = 2.5 x + z over fp32 vectors, a problem folder outside the project's baselines/ (for tests)."""

from __future__ import annotations

from baselines.problem import OutputSpec, Problem, Shape

from .baseline import axpy_torch
from .oracle import axpy_fp64


class Axpy(Problem):
    name = "axpy"
    description = "y = 2.5 x + z over fp32 vectors (a problem folder for tests)"
    shapes = [Shape("N16M", {"N": 1 << 24})]
    cpu_shape = Shape("N1000", {"N": 1000})
    distributions = ("normal", "large")  # large: x and z times 1e3
    tolerance_floor = 1e-6
    tolerance_alpha = 2.0
    outputs = ("y",)
    core_ops = {"add", "axpy"}  # the PyTorch ops that are this operator: refused to candidates

    def make_inputs(self, shape, distribution, seed, device, cpu=False):
        import torch

        if distribution not in self.distributions:
            raise ValueError(f"axpy has no distribution {distribution!r}")
        g = torch.Generator(device="cpu").manual_seed(seed)
        x, z = (torch.randn(shape["N"], generator=g) for _ in range(2))
        if distribution == "large":
            x, z = x * 1e3, z * 1e3
        return {"x": x.to(device), "z": z.to(device)}

    def output_specs(self, shape, cpu=False):
        return {"y": OutputSpec((shape["N"],), "float32")}

    def oracle(self, inputs):
        return {"y": axpy_fp64(inputs["x"], inputs["z"])}

    def baselines(self):
        return {"torch-add": axpy_torch}

    def flops(self, shape):
        return 2.0 * shape["N"]

    def bytes_moved(self, shape):
        return 3 * 4.0 * shape["N"]


PROBLEM = Axpy()
