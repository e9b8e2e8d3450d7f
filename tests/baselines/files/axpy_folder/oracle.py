"""The axpy oracle, in float64."""


def axpy_fp64(x, z):
    return 2.5 * x.double() + z.double()
