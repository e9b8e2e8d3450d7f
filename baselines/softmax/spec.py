"""softmax: a toy problem small enough for the Triton interpreter, used by demos and CI."""

from __future__ import annotations

from baselines.problem import OutputSpec, Problem, Shape

WIDE = 30.0  # the `wide` distribution's scale


class Softmax(Problem):
    name = "softmax"
    description = "row-wise softmax of a fp32 matrix x[M, N] (toy problem for CPU demos and tests)"
    shapes = [Shape("M4096 N4096", {"M": 4096, "N": 4096}), Shape("M16384 N1024", {"M": 16384, "N": 1024})]
    cpu_shape = Shape("M16 N300", {"M": 16, "N": 300})
    # "wide" scales logits by 30: a kernel that skips the max subtraction overflows there
    distributions = ("normal", "wide")
    tolerance_floor = 1e-5
    tolerance_alpha = 4.0
    outputs = ("y",)

    def perturbed(self, inputs, generator, distribution):
        from baselines.perturb import mixed

        if distribution not in self.distributions:
            raise ValueError(f"softmax has no distribution {distribution!r}")
        return {"x": mixed(inputs["x"], generator, WIDE if distribution == "wide" else 1.0)}

    def random_space(self, cpu):
        # rows and columns of every kind: one row, one warp's worth, not a power of two, the widest listed
        if cpu:
            return {"M": (1, 7, 33), "N": (5, 130, 300)}
        return {"M": (1, 37, 1000, 3001), "N": (5, 130, 1000, 3000, 4096)}

    own_generators = True  # each case from a torch.Generator of its own

    def make_inputs(self, shape, distribution, seed, device, cpu=False):
        import torch

        g = torch.Generator(device="cpu").manual_seed(seed)
        x = torch.randn(shape["M"], shape["N"], generator=g, dtype=torch.float32)
        if distribution == "wide":
            x = x * WIDE
        elif distribution != "normal":
            raise ValueError(f"softmax has no distribution {distribution!r}")
        return {"x": x.to(device)}

    def output_specs(self, shape, cpu=False):
        return {"y": OutputSpec((shape["M"], shape["N"]), "float32")}

    def oracle(self, inputs):
        from baselines.softmax.oracle import softmax_fp64

        return {"y": softmax_fp64(inputs["x"])}

    def baselines(self):
        from baselines.softmax.baseline import torch_softmax

        return {"torch.softmax": torch_softmax}

    def flops(self, shape):
        return 5.0 * shape["M"] * shape["N"]

    def bytes_moved(self, shape):
        return 2 * 4.0 * shape["M"] * shape["N"]


PROBLEM = Softmax()
