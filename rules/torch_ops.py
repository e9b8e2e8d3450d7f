"""What a candidate's torch may do: allocate, view, copy, cast and fill. The work is its own Triton.

Held at run time by the guard's dispatch mode (ALLOWED_ATEN_OPS, gpu_worker.guard) and, where a name shows
it, by the static rules (rules.check); told to proposers as TORCH_RULE. Pure data and its lookups: no torch import.
"""

#: the aten ops a candidate's torch may run (gpu_worker.guard refuses every other one while it runs): they
#: allocate, view, copy, cast and fill; any other op computes on data, and the work must be its own Triton.
#: Reading a tensor's values on the host (`item`, `_local_scalar_dense`, a copy of device data to the host)
#: is refused too: host code could compute the answer from them.
ALLOWED_ATEN_OPS = frozenset({
    # allocation
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided", "zeros",
    "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full",
    "scalar_tensor", "lift_fresh", "lift_fresh_copy",
    # views
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "permute", "transpose", "t", "expand",
    "squeeze", "unsqueeze", "slice", "select", "narrow", "split", "split_with_sizes", "chunk", "unbind",
    "unfold", "alias", "detach", "view_as_real", "view_as_complex",
    # copies and casts
    "clone", "contiguous", "copy_", "_to_copy", "to",
    # fills
    "fill_", "zero_",
    # metadata
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_contiguous",
})
#: the rule told to proposers, with the ops above in words
TORCH_RULE = ("In run(), torch may only allocate (empty, zeros, ones, full, *_like, new_*), view (view, reshape, "
              "permute, transpose, expand, squeeze/unsqueeze, slicing, select, narrow, split, chunk, unbind), "
              "copy and cast (clone, contiguous, copy_, to) and fill (fill_, zero_); every other torch op "
              "(arithmetic, reductions, math functions, scans, sorts, gathers, cat, item) is refused: the work "
              "is your own Triton, and a new best's profile may show only your Triton kernels.")
#: torch functions a candidate may call as torch.name(...): allocations, views, copies and queries
#: (rules/host_language.py lists them with torch's dtypes)
ALLOWED_TORCH_CALLS = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "tensor", "as_tensor", "scalar_tensor", "as_strided", "reshape", "permute", "transpose", "t", "squeeze",
    "unsqueeze", "narrow", "select", "split", "chunk", "unbind", "flatten", "unflatten", "movedim",
    "broadcast_to", "view_as_real", "view_as_complex", "detach", "clone", "device", "finfo", "iinfo",
    "is_tensor", "is_floating_point", "is_complex", "numel", "get_default_dtype", "promote_types",
    "result_type", "broadcast_shapes", "no_grad", "inference_mode", "is_grad_enabled", "set_grad_enabled",
    "get_device",
})
#: names of torch functions and Tensor methods that compute on their tensors: the language lists none of
#: them, and a refusal of one names the rule `library-kernel` (rules/refusals.py)
COMPUTE_NAMES = frozenset({
    # elementwise arithmetic and math
    "abs", "absolute", "acos", "acosh", "add", "addcdiv", "addcmul", "angle", "asin", "asinh", "atan", "atan2",
    "atanh", "ceil", "clamp", "clamp_min", "clamp_max", "clip", "cos", "cosh", "deg2rad", "div", "divide",
    "erf", "erfc", "erfinv", "exp", "exp2", "expm1", "floor", "floor_divide", "fmod", "frac", "lerp", "lgamma",
    "log", "log10", "log1p", "log2", "logaddexp", "logaddexp2", "logit", "mul", "multiply", "neg", "negative",
    "pow", "float_power", "reciprocal", "remainder", "round", "rsqrt", "sigmoid", "sign", "sgn", "sin", "sinh",
    "sqrt", "square", "sub", "subtract", "tan", "tanh", "trunc", "xlogy", "true_divide", "hypot", "nan_to_num",
    "relu", "gelu", "silu", "softplus", "mish", "elu", "selu", "leaky_relu", "hardtanh", "logsigmoid",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "logical_and", "logical_or", "logical_xor",
    "logical_not", "maximum", "minimum", "fmax", "fmin", "heaviside", "polar", "conj_physical",
    "abs_", "add_", "sub_", "mul_", "div_", "exp_", "log_", "sqrt_", "rsqrt_", "clamp_", "pow_", "neg_",
    "sigmoid_", "tanh_", "relu_", "masked_fill_", "scatter_", "scatter_add_", "index_put_", "index_add_",
    "index_copy_", "index_fill_", "masked_scatter_", "addcmul_", "addcdiv_", "lerp_", "exponential_",
    # comparisons
    "eq", "ne", "lt", "le", "gt", "ge", "equal", "allclose", "isclose", "isnan", "isinf", "isfinite",
    # reductions, scans and sorts
    "sum", "nansum", "mean", "nanmean", "prod", "amax", "amin", "max", "min", "aminmax", "argmax", "argmin",
    "std", "var", "std_mean", "var_mean", "norm", "logsumexp", "median", "nanmedian", "mode", "quantile",
    "nanquantile", "count_nonzero", "all", "any", "dist", "cumsum", "cumprod", "cummax", "cummin",
    "logcumsumexp", "sort", "argsort", "topk", "kthvalue", "msort", "unique", "unique_consecutive",
    # indexing kernels, data movement and construction from data
    "gather", "scatter", "scatter_add", "scatter_reduce", "index_select", "index_add", "index_copy",
    "index_fill", "index_put", "masked_fill", "masked_select", "masked_scatter", "take", "take_along_dim",
    "where", "nonzero", "searchsorted", "bucketize", "histc", "bincount", "cat", "concat", "concatenate",
    "stack", "hstack", "vstack", "dstack", "repeat", "repeat_interleave", "tile", "flip", "fliplr", "flipud",
    "roll", "rot90", "tril", "triu", "diag", "diag_embed", "trace", "cross", "diff", "pad", "cumulative_trapezoid",
    "item", "tolist", "numpy",
    # normalisation, activations, attention, convolution
    "softmax", "log_softmax", "layer_norm", "group_norm", "batch_norm", "instance_norm", "rms_norm",
    "normalize", "dropout", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "cosine_similarity", "pairwise_distance", "cdist", "embedding", "one_hot",
})

#: per problem: PyTorch ops that *are* the operator (refused even where the language would list the name)
PROBLEM_OPS = {
    "softmax": {"softmax", "log_softmax", "_softmax", "softmin"},
    "kda": {"scaled_dot_product_attention", "softmax", "triangular_solve", "solve_triangular", "inverse", "linalg"},
    "mla": {"scaled_dot_product_attention", "softmax", "log_softmax", "logsumexp"},
}


def problem_ops(problem: str) -> set[str]:
    """The PyTorch ops that are `problem`'s operator: listed above, or read from its file or folder."""
    if problem.startswith("file:"):  # a problem file: the ops its reference calls (baselines/external/reference_ops.py)
        from baselines.external.reference_ops import reference_ops_for_key

        return set(reference_ops_for_key(problem))
    if problem.startswith("folder:"):  # a problem folder names its core ops itself (Problem.core_ops)
        from baselines.registry import get_problem

        return set(getattr(get_problem(problem), "core_ops", ()))
    for key, ops in PROBLEM_OPS.items():
        if problem == key or problem.startswith(key + "_"):
            return ops
    return set()
