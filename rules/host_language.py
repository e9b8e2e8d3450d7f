"""The candidate's host language: what the Python around its Triton kernels may contain (pure data).

The rules accept a construct only if it is listed here (rules/check.py walks the tree): imports of torch,
triton, triton.language and math; module-level constants; plain functions, decorated only by Triton
(`triton.jit`, `triton.autotune`, `triton.heuristics`); assignments, arithmetic, comparisons, `if`, `for`,
`while`, `assert`, `raise` of a builtin error, tuples, lists, dicts and comprehensions; calls of the names
below; kernel launches `kernel[grid](...)`. An attribute is reached only by a name written in the source
and listed here, for a module (MODULE_MEMBERS) or for any other value (VALUE_ATTRS): nothing names an
attribute by a string, and no listed name leads to frames, code, globals, modules or the class graph.
"""

import ast

from rules.torch_ops import ALLOWED_TORCH_CALLS

#: the host's statements, and the expressions it has beyond a kernel's (rules/triton_language.py)
STATEMENTS = (ast.FunctionDef, ast.Assign, ast.Delete, ast.AugAssign, ast.AnnAssign, ast.Return, ast.If, ast.For,
              ast.While, ast.Break, ast.Continue, ast.Pass, ast.Expr, ast.Assert, ast.Raise, ast.Import,
              ast.ImportFrom)
EXTRA_EXPRESSIONS = (ast.Dict, ast.Set, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.JoinedStr,
                     ast.FormattedValue)

#: the modules a candidate may import (and `from __future__ import annotations`)
IMPORTABLE = ("torch", "triton", "triton.language", "math")

TORCH_DTYPES = frozenset({
    "float32", "float16", "bfloat16", "float64", "float", "half", "double", "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64", "bool", "long", "int", "short", "float8_e4m3fn", "float8_e5m2",
    "float8_e4m3fnuz", "float8_e5m2fnuz", "complex64", "complex128", "cfloat",
})
TL_DTYPES = frozenset({
    "float32", "float16", "bfloat16", "float64", "int1", "int8", "int16", "int32", "int64", "uint8", "uint16",
    "uint32", "uint64", "float8e4nv", "float8e5", "float8e4b15", "float8e4b8", "float8e5b16",
})
MATH_MEMBERS = frozenset({
    "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil", "comb", "copysign", "cos", "cosh",
    "degrees", "dist", "e", "erf", "erfc", "exp", "exp2", "expm1", "fabs", "factorial", "floor", "fmod", "frexp",
    "fsum", "gamma", "gcd", "hypot", "inf", "isclose", "isfinite", "isinf", "isnan", "isqrt", "lcm", "ldexp",
    "lgamma", "log", "log10", "log1p", "log2", "modf", "nan", "nextafter", "perm", "pi", "pow", "prod", "radians",
    "remainder", "sin", "sinh", "sqrt", "tan", "tanh", "tau", "trunc", "ulp",
})
#: host code: each module path and the names it may be followed by (a name that is a key is a module, and
#: must be followed by one of its own names: a module is never a value)
MODULE_MEMBERS = {
    "torch": (ALLOWED_TORCH_CALLS - {"no_grad", "inference_mode", "set_grad_enabled", "is_grad_enabled"})
    | TORCH_DTYPES | {"cuda", "nn", "Tensor", "Size", "dtype"},
    "torch.cuda": frozenset({"get_device_properties", "get_device_capability", "is_available", "current_device",
                             "device_count", "is_current_stream_capturing"}),
    "torch.nn": frozenset({"Parameter"}),
    "triton": frozenset({"jit", "autotune", "heuristics", "Config", "cdiv", "next_power_of_2", "language"}),
    "triton.language": TL_DTYPES | {"constexpr"},
    "math": MATH_MEMBERS,
}
#: names that may follow any other value: a tensor's metadata and the methods that allocate, view, copy,
#: cast and fill (torch_ops.ALLOWED_ATEN_OPS), and the containers', devices', dtypes' and configs' own
VALUE_ATTRS = frozenset({
    # tensor metadata
    "shape", "dtype", "device", "ndim", "is_cuda", "is_contiguous", "stride", "size", "numel", "dim",
    "element_size", "nelement", "is_floating_point", "is_complex", "requires_grad", "itemsize", "nbytes",
    "get_device",
    # tensor views, copies, casts and fills
    "T", "mT", "contiguous", "view", "view_as", "reshape", "reshape_as", "permute", "transpose", "t", "expand",
    "expand_as", "squeeze", "unsqueeze", "flatten", "unflatten", "narrow", "select", "split", "chunk", "unbind",
    "movedim", "as_strided", "clone", "copy_", "to", "float", "half", "bfloat16", "double", "int", "long",
    "bool", "fill_", "zero_", "new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided", "detach",
    # dicts, lists and ints
    "get", "items", "keys", "values", "setdefault", "append", "extend", "insert", "pop", "index", "count",
    "bit_length",
    # devices, dtypes, finfo / iinfo, device properties
    "type", "is_signed", "max", "min", "eps", "bits", "tiny", "multi_processor_count", "total_memory", "major",
    "minor", "L2_cache_size", "regs_per_multiprocessor", "max_threads_per_multi_processor", "warp_size",
    "shared_memory_per_block", "shared_memory_per_block_optin", "shared_memory_per_multiprocessor",
    # a triton.Config (an autotuner's pruning function reads its fields)
    "kwargs", "num_warps", "num_stages", "num_ctas", "maxnreg",
})
#: the builtins host code may name; errors only to raise them
BUILTINS = frozenset({
    "abs", "all", "any", "bool", "dict", "divmod", "enumerate", "float", "int", "isinstance", "len", "list", "max",
    "min", "pow", "print", "range", "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple", "zip",
})
ERRORS = frozenset({"ValueError", "TypeError", "RuntimeError", "AssertionError", "NotImplementedError", "KeyError",
                    "IndexError"})
#: Triton's decorators, and the keywords each Triton call may take (no hooks, IR files or timing functions)
DECORATORS = frozenset({"triton.jit", "triton.autotune", "triton.heuristics"})
TRITON_KEYWORDS = {
    "triton.jit": {"do_not_specialize", "do_not_specialize_on_alignment", "debug", "noinline"},
    "triton.autotune": {"configs", "key", "prune_configs_by", "reset_to_zero", "restore_value", "warmup", "rep",
                        "cache_results"},
    "triton.heuristics": {"values"},
    "triton.Config": {"kwargs", "num_warps", "num_stages", "num_ctas", "maxnreg"},
}
TRITON_POSITIONAL = {"triton.jit": 1, "triton.autotune": 2, "triton.heuristics": 1, "triton.Config": 5}
#: what the rules check at its call site (keywords, an assembly literal): called where it is named, never a value
CALLED_WHERE_NAMED = frozenset(TRITON_KEYWORDS) | {"triton.language.inline_asm_elementwise"}
#: a launch's own options, in the words of the refusals and the prompt
LAUNCH_OPTIONS_TEXT = "num_warps, num_stages, num_ctas, maxnreg, launch_pdl"
#: Triton's options a launch also takes as keywords, beside its own (and launch_cooperative_grid,
#: enable_fp_fusion): an IR file, external libraries, PTX options, debug and instrumentation modes. Refused as
#: a keyword of any host call (a launch may be reached through a name) and at every launch of a candidate.
REFUSED_OPTIONS = frozenset({
    "extern_libs", "ir_override", "ptx_options", "ptx_version", "arch", "backend_name", "debug",
    "instrumentation_mode", "sanitize_overflow", "enable_reflect_ftz", "allowed_dot_input_precisions",
    "default_dot_input_precision", "max_num_imprecise_acc_default", "supported_fp8_dtypes",
    "deprecated_fp8_dot_operand_dtypes", "fpsan_homomorphic_casts", "min_shared_mem", "sched4reg", "clc",
    "matrix_instr_nonkdim", "waves_per_eu", "kpack", "schedule_hint"})

#: the language in the words told to proposers (activities/llm/prompt.py), with one example
LANGUAGE_RULE = """\
The module is written in a small language, checked before it runs (anything else is refused, naming the rule):
  imports of torch, triton, triton.language and math only; module-level constants; plain functions, decorated \
only by triton.jit, triton.autotune or triton.heuristics (with triton.Config); assignments, arithmetic, \
comparisons, if, for, while, assert, raise ValueError(...), tuples, lists, dicts, comprehensions; kernel \
launches kernel[grid](...) with the kernel's parameters and """ + LAUNCH_OPTIONS_TEXT + """ (keywords \
spelled out; ** only into your own functions). Attributes only by name: a tensor's shape, stride(), dtype, \
device, numel(), contiguous(), view/reshape/permute/transpose/expand/squeeze/unsqueeze/split/chunk/unbind, clone/copy_/to, \
fill_/zero_, new_empty/new_zeros; dict get/items/keys/values; torch's allocations (empty, zeros, full, \
*_like) and dtypes; triton.cdiv and triton.next_power_of_2; math.*; torch.cuda.get_device_properties. \
Inside @triton.jit functions: tl.*, range and tl.static_range, tl.constexpr, your other @triton.jit \
functions. No classes, lambdas (a grid or a heuristic is a def), generators, try, with, global, decorators \
other than Triton's, getattr and the like, or names starting with an underscore after a dot; every name \
used is defined or imported by the module, or a builtin.
Example:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    def run(inputs, out):
        x = inputs["x"].contiguous()
        n = x.numel()
        _scale[(triton.cdiv(n, 1024),)](x, out["y"], n, BLOCK=1024)"""
