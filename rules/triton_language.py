"""The language of a candidate's @triton.jit functions: Triton's own, listed (pure data).

Triton compiles these bodies on the GPU, but under the interpreter (TRITON_INTERPRET=1) they run as Python,
so they are held to a list as strict as the host's: Triton's statements and expressions, the names of
triton.language (and its math, extra.cuda and libdevice modules) below, the builtins Triton accepts, and
on any value only the attributes of Triton's tensors, pointers, dtypes and descriptors. A test holds the
installed Triton's public names to TL_MEMBERS | TL_REFUSED, so a new Triton's names are a decision.
"""

import ast
import re

from rules.host_language import TL_DTYPES

#: triton.language's names a kernel may use
TL_MEMBERS = TL_DTYPES | frozenset({
    "PropagateNan", "TRITON_MAX_TENSOR_NUMEL", "abs", "add", "arange", "argmax", "argmin", "associative_scan",
    "assume", "atomic_add", "atomic_and", "atomic_cas", "atomic_load", "atomic_max", "atomic_min", "atomic_or",
    "atomic_poll", "atomic_store", "atomic_xchg", "atomic_xor", "bitonic_merge", "broadcast", "broadcast_to",
    "cast", "cat", "cdiv", "ceil", "clamp", "const", "constexpr", "cos", "cumprod", "cumsum", "debug_barrier",
    "device_assert", "device_print", "div_rn", "dot", "dot_scaled", "erf", "exp", "exp2", "expand_dims",
    "expect_zero", "fdiv", "flip", "floor", "fma", "full", "gather", "histogram", "inline_asm_elementwise",
    "interleave", "join", "load", "load_tensor_descriptor", "log", "log2", "make_block_ptr",
    "make_tensor_descriptor", "map_elementwise", "max", "max_constancy", "max_contiguous", "maximum", "min",
    "minimum", "mul", "multiple_of", "num_programs", "pair_uniform_to_normal", "permute", "philox",
    "program_id", "rand", "rand4x", "randint", "randint4x", "randn", "randn4x", "range", "ravel", "reduce",
    "reduce_or", "reshape", "rsqrt", "sigmoid", "sin", "softmax", "sort", "split", "sqrt", "sqrt_rn", "squeeze",
    "static_assert", "static_print", "static_range", "store", "store_tensor_descriptor", "sub", "sum",
    "swizzle2d", "topk", "trans", "uint_to_uniform_float", "umulhi", "unsqueeze", "view", "where", "xor_sum",
    "zeros", "zeros_like",
    "math", "extra",  # modules, followed by their own names
})
#: triton.language's public names a kernel may not use: its IR's types and builders, and its submodules
#: other than math and extra
TL_REFUSED = frozenset({
    "aggregate_replace", "block_type", "condition", "constexpr_type", "dtype", "philox_impl", "pi32_t",
    "pointer_type", "slice", "str_to_ty", "tensor", "tensor_descriptor", "tensor_descriptor_type", "to_tensor",
    "tuple", "tuple_type", "void", "core", "random", "standard", "target_info", "semantic",
})
TL_MATH = frozenset({"abs", "ceil", "cos", "div_rn", "erf", "exp", "exp2", "fdiv", "floor", "fma", "log", "log2",
                     "rsqrt", "sin", "sqrt", "sqrt_rn", "umulhi"})
#: extra.cuda without its clock (globaltimer: device-side timing games) and its helper modules
TL_CUDA = frozenset({"convert_custom_float8_sm70", "convert_custom_float8_sm80", "gdc_launch_dependents",
                     "gdc_wait", "num_threads", "num_warps", "smid", "libdevice"})
LIBDEVICE = frozenset("""
abs acos acosh add_rd add_rn add_ru add_rz asin asinh atan atan2 atanh brev byte_perm cbrt ceil clz copysign cos
cosh cospi cyl_bessel_i0 cyl_bessel_i1 div_rd div_rn div_ru div_rz double2float_rd double2float_rn double2float_ru
double2float_rz double2hiint double2int_rd double2int_rn double2int_ru double2int_rz double2ll_rd double2ll_rn
double2ll_ru double2ll_rz double2loint double2uint_rd double2uint_rn double2uint_ru double2uint_rz double2ull_rd
double2ull_rn double2ull_ru double2ull_rz double_as_longlong erf erfc erfcinv erfcx erfinv exp exp10 exp2 expm1
fast_cosf fast_dividef fast_exp10f fast_expf fast_log10f fast_log2f fast_logf fast_powf fast_sinf fast_tanf
fast_tanhf fdim ffs finitef float2int_rd float2int_rn float2int_ru float2int_rz float2ll_rd float2ll_rn float2ll_ru
float2ll_rz float2uint_rd float2uint_rn float2uint_ru float2uint_rz float2ull_rd float2ull_rn float2ull_ru
float2ull_rz float_as_int float_as_uint floor fma fma_rd fma_rn fma_ru fma_rz fmod hadd hiloint2double hypot ilogb
int2double_rn int2float_rd int2float_rn int2float_ru int2float_rz int_as_float isfinited isinf isnan j0 j1 jn ldexp
lgamma ll2double_rd ll2double_rn ll2double_ru ll2double_rz ll2float_rd ll2float_rn ll2float_ru ll2float_rz llrint
llround log log10 log1p log2 logb longlong_as_double mul24 mul_rd mul_rn mul_ru mul_rz mulhi nearbyint nextafter
norm3d norm4d normcdf normcdfinv popc pow rcbrt rcp64h rcp_rd rcp_rn rcp_ru rcp_rz remainder rhadd rhypot rint
rnorm3d rnorm4d round rsqrt rsqrt_rn sad saturatef scalbn signbit sin sinh sinpi sqrt sqrt_rd sqrt_rn sqrt_ru
sqrt_rz sub_rd sub_rn sub_ru sub_rz tan tanh tgamma trunc uint2double_rn uint2float_rd uint2float_rn uint2float_ru
uint2float_rz uint_as_float ull2double_rd ull2double_rn ull2double_ru ull2double_rz ull2float_rd ull2float_rn
ull2float_ru ull2float_rz y0 y1 yn
""".split())
#: kernel code: each module path and its names (a key is a module; `triton.language` is reached as `tl`, or
#: spelled out through `triton`)
KERNEL_MODULE_MEMBERS = {
    "triton": frozenset({"language"}),
    "triton.language": TL_MEMBERS,
    "triton.language.math": TL_MATH,
    "triton.language.extra": frozenset({"cuda", "libdevice"}),
    "triton.language.extra.cuda": TL_CUDA,
    "triton.language.extra.libdevice": LIBDEVICE,
    "triton.language.extra.cuda.libdevice": LIBDEVICE - {"fast_tanhf"},
}
#: names that may follow a value inside a kernel: Triton's tensor methods, a tensor's, pointer's and dtype's
#: fields, a constexpr's value, a descriptor's and a block pointer's methods
KERNEL_VALUE_ATTRS = frozenset({
    "T", "abs", "advance", "argmax", "argmin", "associative_scan", "atomic_add", "atomic_and", "atomic_cas",
    "atomic_load", "atomic_max", "atomic_min", "atomic_or", "atomic_poll", "atomic_store", "atomic_xchg",
    "atomic_xor", "broadcast_to", "cast", "cdiv", "ceil", "cos", "cumprod", "cumsum", "erf", "exp", "exp2",
    "expand_dims", "flip", "floor", "gather", "histogram", "item", "log", "log2", "logical_and", "logical_or",
    "max", "min", "permute", "ravel", "reduce", "reduce_or", "reshape", "rsqrt", "sigmoid", "sin", "softmax",
    "sort", "split", "sqrt", "sqrt_rn", "store", "sum", "to", "trans", "view", "xor_sum",
    "dtype", "shape", "numel", "element_ty", "primitive_bitwidth", "value", "block_shape", "load", "scatter",
    "scalar", "is_bf16", "is_bool", "is_floating", "is_fp16", "is_fp32", "is_fp64", "is_fp8", "is_int",
    "is_int_signed", "is_int_unsigned", "is_ptr", "is_standard_floating", "ALL", "NONE",
})
#: the builtins Triton's code generator accepts in a kernel
KERNEL_BUILTINS = frozenset({"range", "min", "max", "float", "int", "bool", "len", "abs", "print"})

#: inline PTX (tl.inline_asm_elementwise) computes on its operands only: no clock or performance-counter
#: register (device-side timing games, as extra.cuda's globaltimer) and no instruction that reaches memory,
#: synchronizes or jumps (reading or writing what its operands do not hold), but for prefetches to the
#: cache, which move no data into the kernel (ASM_PREFETCHES)
ASM_SPECIAL_REGISTERS = ("%globaltimer", "%clock", "%pm")
ASM_OPCODES_REFUSED = frozenset({
    "ld", "ldu", "st", "atom", "red", "cp", "membar", "fence", "bar", "barrier",
    "mbarrier", "call", "ret", "bra", "brx", "exit", "trap", "brkpt", "nanosleep", "pmevent", "cvta", "isspacep",
    "tensormap", "wgmma", "mma", "wmma", "ldmatrix", "stmatrix", "multimem", "griddepcontrol", "elect", "setmaxnreg",
    "applypriority", "discard", "createpolicy", "getctarank", "clusterlaunchcontrol", "tcgen05",
    "tex", "tld4", "txq", "suld", "sust", "sured", "suq",
})


ASM_PREFETCHES = ("cp.async.bulk.prefetch.",)


def asm_refusal(asm: str) -> tuple[str, str] | None:
    """Why an inline PTX string is refused, as (rule, reason), or None."""
    low = asm.lower()
    # LLVM rewrites its escapes before PTX reads the text: `$$` and the dialect groups `$(`, `$|`, `$)` could
    # join or hide what is read here
    if re.search(r"\$[$(|)]", low):
        return "escape", "inline PTX: LLVM's $$, $(, $| and $) escapes are not allowed (operands are $0, $1, ...)"
    for reg in ASM_SPECIAL_REGISTERS:
        if reg in low:
            return "timer", f"inline PTX reads {reg}...: a device clock or counter register"
    # PTX reads a comment as whitespace, from the left (a `//` inside /* */ is the comment's); labels (`L9:`)
    # and predicate guards (`@p`, `@ !p`) come before an opcode
    code = re.sub(r"/\*.*?\*/|//[^\n]*", " ", low, flags=re.S)
    for stmt in code.replace("{", ";").replace("}", ";").replace("\n", ";").split(";"):
        stmt = re.sub(r"^(\s*[a-z_$%][\w$]*\s*:)+", " ", stmt)
        words = re.sub(r"^(\s*@\s*!?\s*[\w$%]+)+", " ", stmt).split()
        if words and words[0].split(".")[0] in ASM_OPCODES_REFUSED and not words[0].startswith(ASM_PREFETCHES):
            return "escape", (f"inline PTX instruction {words[0]!r}: inline assembly may only compute on its "
                              "operands (no memory, synchronization or jumps)")
    return None

#: the statements and expressions of a @triton.jit body (any other construct is refused)
STATEMENTS = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.If, ast.For, ast.While, ast.Break,
              ast.Continue, ast.Pass, ast.Expr, ast.Assert)
EXPRESSIONS = (ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.IfExp, ast.Compare, ast.Call, ast.Constant,
               ast.Attribute, ast.Subscript, ast.Starred, ast.Name, ast.List, ast.Tuple, ast.Slice)
