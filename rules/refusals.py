"""Which rule a refused name breaks (pure data and lookups): the rules accept only what the language lists
(rules/host_language.py, rules/triton_language.py); this names the cheating family of what they refuse,
where it has one, so that a rejection says why: a stream API is `stream`, `torch.exp` is `library-kernel`,
a frame's attribute is `escape`, and a name outside every family is `language`.
"""

import ast
import sys

from rules.torch_ops import COMPUTE_NAMES

#: third-party kernel libraries and the project's own modules
KERNEL_LIBRARIES = (
    "fla", "flash_attn", "flashinfer", "xformers", "sglang", "vllm", "deep_gemm", "flash_mla",
    "liger_kernel", "tilelang", "flash_kda", "cutlass", "apex", "transformer_engine", "thunderkittens",
    "baselines", "gpu_worker", "activities", "workflows", "rules", "cli",
)
#: modules by family (an import of any other module outside the language is a forbidden-import)
SYSTEM_MODULES = {
    "os": "escape", "sys": "escape", "posix": "escape", "subprocess": "process", "_posixsubprocess": "process",
    "pty": "process", "multiprocessing": "process", "socket": "network", "_socket": "network", "ssl": "network",
    "http": "network", "urllib": "network", "ftplib": "network", "smtplib": "network", "socketserver": "network",
    "xmlrpc": "network", "asyncio": "lazy-output", "threading": "lazy-output", "_thread": "lazy-output",
    "concurrent": "lazy-output", "sched": "lazy-output", "time": "timer", "timeit": "timer",
    "ctypes": "escape", "cffi": "escape", "importlib": "escape", "inspect": "escape", "gc": "escape",
    "pickle": "escape", "marshal": "escape", "builtins": "escape", "shutil": "filesystem",
    "pathlib": "filesystem", "io": "filesystem", "tempfile": "filesystem", "glob": "filesystem",
    "signal": "escape", "runpy": "escape", "code": "escape", "types": "escape", "weakref": "output-cache",
    "operator": "escape", "functools": "escape", "typing": "escape", "dataclasses": "escape", "enum": "escape",
    "copyreg": "escape", "traceback": "escape", "linecache": "escape", "dis": "escape",
}
MATMUL_NAMES = frozenset({"matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "einsum", "linear", "bilinear",
                          "tensordot", "chain_matmul", "addmv", "mv", "inner", "outer", "dot", "vdot", "kron"})
#: names by family, wherever they appear (torch.X, x.X, a builtin)
NAME_FAMILY = {
    **{n: "output-cache" for n in ("data_ptr", "untyped_storage", "storage", "storage_offset", "unsafe_chunk",
                                   "lru_cache", "cache", "cached_property", "id", "hash", "weakref", "_version",
                                   "_cdata", "_base")},
    **{n: "lazy-output" for n in ("as_subclass", "TorchFunctionMode", "TorchDispatchMode", "Thread", "Timer",
                                  "overrides", "_python_dispatch", "register_hook", "register_forward_hook")},
    **{n: "process" for n in ("Process", "Popen", "system", "fork", "spawn", "posix_spawn", "multiprocessing")},
    **{n: "stream" for n in ("Stream", "stream", "Event", "graph", "graphs", "CUDAGraph", "set_stream",
                             "synchronize", "current_stream", "default_stream", "ExternalStream", "cudart",
                             "streams", "make_graphed_callables")},
    **{n: "timer" for n in ("time", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time",
                            "elapsed_time", "record", "do_bench", "globaltimer", "clock", "timeit")},
    **{n: "filesystem" for n in ("open", "save", "load_library")},
    **{n: "network" for n in ("distributed", "socket", "hub")},
    **{n: "library-kernel" for n in ("ops", "compile", "library", "cpp_extension", "scaled_dot_product_attention",
                                     "backends", "functional", "special", "fft", "linalg", "Linear", "@")},
}
#: names that reach frames, code, globals, modules, the class graph or the interpreter, by attribute or call
ESCAPE_NAMES = frozenset({
    "f_globals", "f_locals", "f_back", "f_builtins", "f_code", "f_trace", "gi_frame", "gi_code", "gi_yieldfrom",
    "cr_frame", "cr_code", "cr_await", "ag_frame", "ag_code", "tb_frame", "tb_next", "co_code", "co_consts",
    "co_names", "mro", "modules", "builtins", "get_type_hints", "attrgetter", "methodcaller", "getattr",
    "setattr", "delattr", "hasattr", "vars", "dir", "globals", "locals", "eval", "exec", "compile", "type",
    "object", "super", "property", "staticmethod", "classmethod", "breakpoint", "memoryview", "utils", "jit",
    "fx", "autograd", "profiler", "memory", "nvtx", "runtime", "compiler", "knobs", "testing", "tools",
    "backends", "fn", "src", "module", "frame", "load", "export", "package", "classes",
    "pre_hook", "post_hook", "ir_override", "repr", "launch_metadata", "format",
    "format_map", "reduce_ex", "core", "semantic", "standard", "extra", "gpu_worker", "activities", "workflows",
    "baselines", "pkgutil", "module_from_spec", "module_finder", "is_pkg", "help", "license", "credits",
    "copyright", "input", "exit", "quit",
})
STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) - {"math"}


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and len(name) > 4


def name_rule(name: str, under_torch: bool = False) -> tuple[str, str]:
    """(rule, why) for a name the language does not list; `under_torch`: reached from torch."""
    if name in NAME_FAMILY:
        fam = NAME_FAMILY[name]
        why = {"output-cache": "pointer-, identity- or version-keyed state", "lazy-output": "work done outside "
               "the call", "stream": "streams, events, graphs and synchronisation are the timer's",
               "timer": "timers are the harness's", "library-kernel": "library kernels may not do the work",
               }.get(fam, f"{fam} access")
        return fam, why
    if name in COMPUTE_NAMES or name in MATMUL_NAMES:
        return "library-kernel", ("it computes in torch; torch may only allocate, view, copy, cast and fill "
                                  "(the work is your Triton)")
    if name.startswith("_"):
        return "escape", "names starting with an underscore are not allowed"
    if name in ESCAPE_NAMES:
        return "escape", "it reaches introspection (frames, code, globals, modules or attributes by string)"
    if name in SYSTEM_MODULES:
        return SYSTEM_MODULES[name], f"the {name!r} module is outside the language"
    if name in STDLIB:
        return "escape", f"the standard library's {name!r} is outside the language"
    if under_torch and name[:1].islower():
        return "library-kernel", ("torch may only allocate, view, copy, cast and fill (the work is your "
                                  "Triton)")
    return "language", "it is not in the language's list"


def import_rule(module: str) -> tuple[str, str]:
    """(rule, why) for an import the language does not allow (`why` follows "import of 'name' is ")."""
    top = module.split(".")[0]
    for lib in KERNEL_LIBRARIES:
        if module == lib or module.startswith(lib + "."):
            return "forbidden-import", "not allowed: kernel libraries and the project's own modules are not"
    if top in SYSTEM_MODULES:
        return SYSTEM_MODULES[top], "not allowed in a candidate"
    rules = [name_rule(part) for part in module.split(".")[1:]] \
        if top in ("torch", "triton") else []
    for rule, why in sorted(rules, key=lambda r: (r[0] == "escape", r[0] == "language")):
        if rule != "language":
            return rule, f"not allowed: {why}"
    return "forbidden-import", "not allowed: allowed are torch, triton, triton.language and math"


#: constructs outside the language, each with its rule and the words of its refusal
CONSTRUCTS = {
    ast.ClassDef: ("language", "a class statement: write functions (the project builds a problem file's "
                               "ModelNew around them)"),
    ast.AsyncFunctionDef: ("language", "'async def': coroutines are outside the language"),
    ast.Await: ("language", "'await': coroutines are outside the language"),
    ast.Yield: ("language", "'yield': generator functions are outside the language"),
    ast.YieldFrom: ("language", "'yield from': generator functions are outside the language"),
    ast.Lambda: ("language", "a lambda: write a def (a launch grid or a heuristic may be a function)"),
    ast.NamedExpr: ("language", "':=' is outside the language"),
    ast.Try: ("fallback", "try/except is not allowed (no fallback paths)"),
    ast.Global: ("output-cache", "'global' is not allowed (state across calls)"),
    ast.Nonlocal: ("output-cache", "'nonlocal' is not allowed (state across calls)"),
    ast.With: ("language", "a 'with' statement is outside the language"),
    ast.AsyncWith: ("language", "'async with': coroutines are outside the language"),
    ast.AsyncFor: ("language", "'async for': coroutines are outside the language"),
    ast.Match: ("language", "'match' is outside the language (its class patterns read attributes by name)"),
}
if hasattr(ast, "TryStar"):
    CONSTRUCTS[ast.TryStar] = CONSTRUCTS[ast.Try]
