"""The candidate language: honest host code and Triton pass; every way to reach an attribute by a string, a
frame, a descriptor or a hook is refused at the rules with its one-line reason; the lists match the
installed torch and Triton."""

import pytest

from rules.check import check_source

HEAD = "import torch\nimport triton\nimport triton.language as tl\n"


def src(body: str) -> str:
    return HEAD + body + "\n\ndef run(inputs, out):\n    pass\n"


def refused(code: str, problem: str = "softmax"):
    rep = check_source(src(code), problem)
    assert not rep.ok, code
    assert rep.detail.startswith("line ") and "\n" not in rep.detail, rep  # one line, naming where
    return rep


@pytest.mark.parametrize("code", [
    # autotuning, heuristics and a launch grid, as functions
    "@triton.autotune(configs=[triton.Config({'B': 64}, num_warps=4), triton.Config({'B': 128}, num_stages=2)],\n"
    "                 key=['n'], prune_configs_by={'early_config_prune': None}, reset_to_zero=['y'])\n"
    "@triton.jit\ndef k(x, y, n, B: tl.constexpr):\n    tl.store(y + tl.arange(0, B), tl.load(x + tl.arange(0, B)))\n"
    "def grid(meta):\n    return (triton.cdiv(1024, meta['B']),)\n"
    "def prune(configs, named_args, **kwargs):\n    return [c for c in configs if c.kwargs['B'] <= 128]",
    "def block(args):\n    return triton.next_power_of_2(args['n'])\n"
    "@triton.heuristics(values={'B': block})\n@triton.jit(do_not_specialize=['n'])\ndef k(x, n, B: tl.constexpr):\n"
    "    pass",
    # host code: containers, comprehensions, generator expressions, f-strings, raise, del, while, star-args
    "def prep(inputs, **kw):\n    a, b = (inputs[n].contiguous() for n in ('a', 'b'))\n"
    "    sizes = {k: v.shape for k, v in inputs.items()}\n"
    "    xs = [t.float() for t in inputs.values() if t.ndim == 2]\n"
    "    if not xs:\n        raise ValueError(f'no 2-d input among {sorted(sizes)!r}')\n"
    "    del xs[1:]\n    n = 1\n    while n < a.shape[-1]:\n        n *= 2\n    return max(*[n, 16]), kw.get('extra')",
    "from triton import cdiv\nfrom math import sqrt\nLAUNCHED: dict = {}\nC = cdiv(300, 64) * sqrt(2.0)",
    "n = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 4",
    "@triton.jit\ndef k(x, B: tl.constexpr):\n    pass\n"
    "def go(x):\n    k[(1,)](x, B=64, num_warps=4, num_stages=2, maxnreg=128, launch_pdl=True)",
    "@triton.jit\ndef k(x, B: tl.constexpr):\n    pass\n"
    "def go(x, **opts):\n    k[(1,)](x, B=opts.get('B', 64), num_warps=4)\ndef run2(x):\n    go(x, **{'B': 32})",
    "def f(x):\n    y = torch.empty_strided((4, 4), (4, 1), dtype=torch.bfloat16, device=x.device)\n"
    "    return y.new_zeros((2,)).view(-1), x.device.type == 'cuda', torch.finfo(x.dtype).max",
    # kernels: tl.extra, libdevice, static_range, constexpr locals, dtype fields, a while loop
    "@triton.jit\ndef k(p, N: tl.constexpr):\n    H: tl.constexpr = N // 2\n    for i in tl.static_range(H):\n"
    "        v = tl.load(p + i).to(p.dtype.element_ty)\n    w = tl.extra.cuda.libdevice.rsqrt(v)\n"
    "    b = p.dtype.element_ty.primitive_bitwidth // 8\n    while b < 4:\n        b += 1\n"
    "    tl.extra.cuda.gdc_wait()\n    tl.store(p, tl.math.exp(w) + tl.sum(v.reshape(1), axis=0) + b)",
    # names bound in their own scope, an enclosing function's or the module's (a later definition too)
    "B = 3\ndef f(t=B):\n    s = 2\n    def g():\n        return s + t + h()\n    del s\n    return g\n"
    "def h():\n    return [i * 2 for i in range(B)]",
    # inline PTX that computes on its operands only
    "@triton.jit\ndef k(p):\n    x = tl.load(p)\n    y = tl.inline_asm_elementwise('ex2.approx.f32 $0, $1;', '=r,r', [x], "
    "dtype=tl.float32, is_pure=True, pack=1)\n    tl.store(p, y)",
    "@triton.jit\ndef k(p, n):\n    tl.inline_asm_elementwise('{ @%p1 cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }', "
    "'=r,l,r', [p, n], dtype=tl.int32, is_pure=False, pack=1)",
])
def test_honest_host_and_triton_pass(code):
    rep = check_source(src(code), "softmax")
    assert rep.ok, (code, rep)


def test_the_prompt_s_language_and_its_example():
    from activities.llm.prompt import SYSTEM_PROMPT
    from rules.host_language import LANGUAGE_RULE

    assert LANGUAGE_RULE in SYSTEM_PROMPT
    example = LANGUAGE_RULE.split("Example:\n", 1)[1]
    example = "\n".join(line[4:] for line in example.splitlines())
    assert check_source(example, "softmax").ok


@pytest.mark.parametrize("code,rule,words", [
    # constructs outside the language, each named
    ("class Cfg:\n    b = 1", "language", "a class statement"),
    ("f = lambda m: (1,)", "language", "a lambda"),
    ("def g():\n    yield 1", "language", "'yield'"),
    ("def g():\n    yield from ()", "language", "'yield from'"),
    ("async def c():\n    pass", "language", "'async def'"),
    ("def f(x):\n    with x:\n        pass", "language", "'with'"),
    ("def f(x):\n    match x:\n        case _:\n            pass", "language", "'match'"),
    ("def f(x):\n    if (y := x):\n        pass", "language", "':='"),
    ("try:\n    pass\nexcept Exception:\n    pass", "fallback", "try/except"),
    ("def f():\n    global Z\n    Z = 1", "output-cache", "'global'"),
    ("def f():\n    n = 1\n    def g():\n        nonlocal n\n        n = 2", "output-cache", "'nonlocal'"),
    ("from torch import *", "escape", "import *"),
    ("import numpy", "forbidden-import", "allowed are torch, triton, triton.language and math"),
    ("import functools", "escape", "import of 'functools' is not allowed"),
    ("import operator", "escape", "import of 'operator' is not allowed"),
    ("import inspect", "escape", "import of 'inspect' is not allowed"),
    ("import typing", "escape", "import of 'typing' is not allowed"),
    ("def deco(f):\n    return f\n@deco\ndef g():\n    pass", "language", "only Triton's"),
    ("raise SystemExit(1)", "language", "raise only a builtin error"),
    ("y = iter([1])", "language", "builtin 'iter'"),
    ("y = x.sum()", "library-kernel", "computes in torch"),
    ("@triton.heuristics(values={'B': lambda args: 64})\n@triton.jit\ndef k(B: tl.constexpr):\n    pass", "language",
     "a lambda"),
    # inside kernels: Triton's language only
    ("@triton.jit\ndef k(p):\n    v = [i for i in range(4)]", "language", "ListComp inside a @triton.jit"),
    ("@triton.jit\ndef k(p):\n    d = {'a': 1}", "language", "Dict inside a @triton.jit"),
    ("@triton.jit\ndef k(p):\n    x = torch.float32", "language", "torch is host code"),
    ("@triton.jit\ndef k(p):\n    x = math.pi", "language", "builtin"),
    ("@triton.jit\ndef k(p):\n    def inner():\n        pass", "language", "inside a @triton.jit function"),
    ("x = tl.arange(0, 4)", "language", "for @triton.jit functions only"),
])
def test_constructs_outside_the_language_are_refused_by_name(code, rule, words):
    if "math.pi" in code:
        code = "import math\n" + code
        words = "math is host code"
    rep = refused(code)
    assert rep.rule == rule and words in rep.detail, (code, rep)


# --- adversaries: an attribute named by a string, frames, descriptors, hooks --------------------------------

@pytest.mark.parametrize("code,rule", [
    # attribute access by string: builtins, str.format's fields, helpers of allowed modules
    ("f = getattr(run, '__glo' + 'bals__')", "escape"),
    ("setattr(torch.Tensor, 'copy_', None)", "escape"),
    ("f = hasattr(run, 'x')", "escape"),
    ("f = vars(torch)", "escape"),
    ("s = '{0.__globals__}'.format(run)", "escape"),
    ("s = '{0.__globals__}'.format_map({'0': run})", "escape"),
    ("f = sorted([run], key=getattr)", "escape"),
    ("import operator\nf = operator.attrgetter('__globals__')(run)", "escape"),
    ("from operator import attrgetter", "escape"),
    ("import functools\nf = functools.reduce(getattr, ['__globals__'], run)", "escape"),
    ("f = torch.Tensor.__getattribute__(x, 'grad_fn')", "escape"),
    ("f = torch.nn.Module.get_submodule", "language"),
    ("f = torch.fx.Tracer", "escape"),
    ("f = torch.utils._pytree.tree_map", "escape"),
    ("f = torch.overrides.resolve_name(torch.exp)", "lazy-output"),
    ("f = torch.package.PackageImporter", "escape"),
    ("f = torch.compiler.disable", "escape"),
    ("f = torch.library.Library", "library-kernel"),
    ("f = torch.cuda.get_device_properties(0).__class__", "escape"),
    ("f = x.grad_fn.next_functions", "language"),
    ("f = torch.Tensor.register_hook", "lazy-output"),
    ("f = triton.runtime.driver.active", "escape"),
    ("f = triton.knobs.runtime", "escape"),
    ("f = triton.language.core.builtin", "escape"),
    ("f = triton.JITFunction", "language"),
    ("@triton.jit\ndef k(p):\n    pass\nf = k.fn", "escape"),
    ("@triton.jit\ndef k(p):\n    pass\nf = k.src", "escape"),
    ("@triton.jit\ndef k(p):\n    pass\nf = k.cache", "output-cache"),
    ("@triton.jit\ndef k(p):\n    pass\nf = k[(1,)](x).asm", "language"),
    # Triton's own hooks and IR files: the calls that take them are held to their keywords
    ("c = triton.Config({'B': 1}, pre_hook=run)", "escape"),
    ("c = triton.Config({'B': 1}, 4, 3, 1, None, run)", "escape"),
    ("c = triton.Config({'B': 1}, ir_override='/tmp/k.ttgir')", "escape"),
    ("c = triton.Config(**{'kwargs': {}, 'pre_hook': run})", "escape"),
    ("@triton.autotune(configs=[], key=[], do_bench=run)\n@triton.jit\ndef k(p):\n    pass", "timer"),
    ("@triton.autotune(configs=[], key=[], pre_hook=run)\n@triton.jit\ndef k(p):\n    pass", "escape"),
    ("@triton.autotune(configs=[], key=[], use_cuda_graph=True)\n@triton.jit\ndef k(p):\n    pass", "escape"),
    ("@triton.jit(repr=run)\ndef k(p):\n    pass", "escape"),
    ("@triton.jit(launch_metadata=run)\ndef k(p):\n    pass", "escape"),
    # inside a kernel (which runs as Python under the interpreter)
    ("@triton.jit\ndef k(p):\n    h = p.handle", "language"),
    ("@triton.jit\ndef k(p):\n    h = getattr(p, 'handle')", "escape"),
    ("@triton.jit\ndef k(p):\n    h = tl.core.builtin", "escape"),
    ("@triton.jit\ndef k(p):\n    h = tl.extra.pkgutil", "escape"),
    ("@triton.jit\ndef k(p):\n    h = tl.extra.module_from_spec", "escape"),
    ("@triton.jit\ndef k(p):\n    t = tl.extra.cuda.globaltimer()", "timer"),
    # inline PTX: the same clock by another door, memory beyond its operands, an unreadable string
    ("@triton.jit\ndef k(p):\n    t = tl.inline_asm_elementwise('mov.u64 $0, %globaltimer;', '=l', [], "
     "dtype=tl.int64, is_pure=False, pack=1)", "timer"),
    ("@triton.jit\ndef k(p):\n    t = tl.inline_asm_elementwise(asm='mov.u32 $0, %clock;', constraints='=r', "
     "args=[], dtype=tl.int32, is_pure=False, pack=1)", "timer"),
    ("@triton.jit\ndef k(p, a):\n    t = tl.inline_asm_elementwise('{ @%p1 ld.global.u32 $0, [$1]; }', '=r,l', "
     "[a], dtype=tl.int32, is_pure=True, pack=1)", "escape"),
    ("@triton.jit\ndef k(p, a):\n    t = tl.inline_asm_elementwise('add.f32 $0, $1, $1;\\n st.global.f32 [$2], $0;', "
     "'=r,r,l', [a, p], dtype=tl.float32, is_pure=False, pack=1)", "escape"),
    ("A = 'mov.u64 $0, %globaltimer;'\n@triton.jit\ndef k(p):\n    t = tl.inline_asm_elementwise(A, '=l', [], "
     "dtype=tl.int64, is_pure=False, pack=1)", "language"),
    ("@triton.jit\ndef k(p):\n    h = p.__class__", "escape"),
    # PTX reads comments as whitespace and a label as no instruction: neither hides the opcode behind it
    ("@triton.jit\ndef k(p, a):\n    t = tl.inline_asm_elementwise('/* */ ld.global.f32 $0, [$1];', '=r,l', [a], "
     "dtype=tl.float32, is_pure=True, pack=1)", "escape"),
    ("@triton.jit\ndef k(p, a):\n    t = tl.inline_asm_elementwise('mov.u32 $0, 0; // x\\n/**/nanosleep.u32 1;', "
     "'=r', [], dtype=tl.int32, is_pure=False, pack=1)", "escape"),
    ("@triton.jit\ndef k(p, a):\n    t = tl.inline_asm_elementwise('L9:membar.gl; mov.u32 $0, 0;', '=r', [], "
     "dtype=tl.int32, is_pure=False, pack=1)", "escape"),
    ("@triton.jit\ndef k(p, a):\n    t = tl.inline_asm_elementwise('/* // */ ld.global.f32 $0, [$1];', '=r,l', [a], "
     "dtype=tl.float32, is_pure=True, pack=1)", "escape"),
    ("@triton.jit\ndef k(p, a):\n    t = tl.inline_asm_elementwise('{ .reg .pred q; setp.eq.u32 q, 1, 1; @ q ld.global.f32 "
     "$0, [$1]; }', '=r,l', [a], dtype=tl.float32, is_pure=True, pack=1)", "escape"),
    # LLVM's dialect groups would hide an opcode or join a register's name before PTX reads the text
    ("@triton.jit\ndef k(p, a):\n    t = tl.inline_asm_elementwise('$( ld.global.f32 $0, [$1]; $)', '=r,l', [a], "
     "dtype=tl.float32, is_pure=True, pack=1)", "escape"),
    ("@triton.jit\ndef k(p):\n    t = tl.inline_asm_elementwise('mov.u32 $0, %global$(timer_lo$);', '=r', [], "
     "dtype=tl.int32, is_pure=False, pack=1)", "escape"),
    ("@triton.jit\ndef k(p, a):\n    t = tl.inline_asm_elementwise('tex.1d.v4.f32.s32 {$0, $1, $2, $3}, [t, {$4}];', "
     "'=r,=r,=r,=r,r', [a], dtype=tl.float32, is_pure=True, pack=1)", "escape"),
    # descriptors and hooks: class bodies, decorators, the builtins that make them
    ("class D:\n    def __get__(self, obj, owner):\n        return 1", "language"),
    ("class D:\n    def __set_name__(self, owner, name):\n        pass", "language"),
    ("class H:\n    def __torch_function__(self, func, types, args=(), kwargs=None):\n        pass", "lazy-output"),
    ("p = property(run)", "escape"),
    ("@property\ndef f(self):\n    return 1", "escape"),
    ("@staticmethod\ndef f():\n    return 1", "escape"),
    ("def __getattr__(name):\n    return name", "escape"),
    ("__getattr__ = run", "escape"),
    ("def f(__class__):\n    pass", "escape"),
    # a refused builtin bound under its own name, so that a use of it would look like the candidate's
    ("def f(getattr=getattr):\n    return getattr(run, 'x')", "escape"),
    ("def f(g):\n    vars = g\n    return vars", "escape"),
    ("for type in (1,):\n    pass", "escape"),
    ("y = [help for help in ()]", "escape"),
    ("def f(iter, next):\n    pass\ndef g(t):\n    return next(iter(t))", "escape"),
    # a kernel called from host code: the interpreter would run it as host Python and hand back its value
    ("@triton.jit\ndef k():\n    return 1\ndef f():\n    return k()", "language"),
    # frames: a generator's, a coroutine's, a traceback's, and what they lead to
    ("def g():\n    yield 1\nf = g().gi_frame.f_back.f_globals", "escape"),
    ("f = (i for i in ()).gi_frame", "escape"),
    ("async def c():\n    pass\nf = c().cr_frame.f_back", "escape"),
    ("def tb(e):\n    return e.__traceback__.tb_frame.f_back.f_locals", "escape"),
    ("def tb(e):\n    return e.tb_frame", "escape"),
    ("f = run.__code__.co_consts", "escape"),
    ("f = run.__globals__['torch']", "escape"),
    ("f = x.f_back", "escape"),
    ("b = __builtins__", "escape"),
    ("f = (1).__class__.__base__.__subclasses__()", "escape"),
    ("f = x.mro", "escape"),
    # a name nobody bound is found in the module's globals, where a library may have put one (Triton's
    # interpreter puts numpy, time and inspect there), as is a name bound elsewhere or deleted at the top level
    ("def f(t):\n    return np.append(t, t)", "escape"),
    ("def g(np):\n    return np\ndef f(t):\n    return np.append(t, t)", "escape"),
    ("A = [np for np in (1,)]\nB = np", "escape"),
    ("A = [np for np in [np]]", "escape"),  # the first iterable is read in the enclosing scope
    ("np: int\ndef f(t):\n    return np", "escape"),  # an annotation alone binds nothing
    ("def f(t: np) -> np:\n    return t", "escape"),
    ("np = 0\nif np == 0:\n    del np", "escape"),
    # a module as a value, an import's name rebound: the chain would leave the lists
    ("m = torch", "escape"),
    ("f = print(triton)", "escape"),
    ("m = [tl]", "escape"),
    ("m = torch.cuda", "escape"),
    ("torch = {}", "escape"),
    ("def f(tl):\n    return tl.anything", "escape"),
    ("for torch in ():\n    pass", "escape"),
    ("torch.Tensor.copy_ = None", "escape"),
    ("x.data = None", "escape"),
    # what the rules read at a call site, reached as a value: its keywords or its assembly go unread
    ("@triton.jit\ndef k(p):\n    t = (tl.inline_asm_elementwise if True else tl.inline_asm_elementwise)(\n"
     "        'mov.u64 $0, %globaltimer;', '=l,r', [p], dtype=tl.int64, is_pure=False, pack=1)", "escape"),
    ("@triton.jit\ndef k(p):\n    t = (tl.inline_asm_elementwise,)[0]('nanosleep.u32 1;', '=r', [p], "
     "dtype=tl.int32, is_pure=False, pack=1)", "escape"),
    ("from triton.language import inline_asm_elementwise as ia\n@triton.jit\ndef k(p):\n    f = ia", "escape"),
    ("cfg = triton.Config\nc = cfg({}, num_warps=4, pre_hook=print)", "escape"),
    ("tune = triton.autotune\nD = {'c': triton.Config}", "escape"),
    ("jits = [triton.jit]", "escape"),
    # Triton's options beyond a launch's own, on a launch or on any call (a launch bound to a name), or hidden
    # in '**' anywhere but into a function of the module
    ("@triton.jit\ndef k(p):\n    pass\ndef go(x):\n    k[(1,)](x, extern_libs={'m': '/tmp/m.bc'})", "escape"),
    ("@triton.jit\ndef k(p):\n    pass\ndef go(x):\n    k[(1,)](x, ir_override='/tmp/k.ttgir')", "escape"),
    ("@triton.jit\ndef k(p):\n    pass\ndef go(x):\n    f = k[(1,)]\n    f(x, ptx_options='--x')", "escape"),
    ("@triton.jit\ndef k(p):\n    pass\ndef go(x, o):\n    k[(1,)](x, **o)", "escape"),
    ("@triton.jit\ndef k(p):\n    pass\ndef go(x):\n    f = k[(1,)]\n    f(x, **{'extern_' + 'libs': {}})",
     "escape"),
    ("def h(x, **kw):\n    return kw\nh = print\ndef go(x):\n    h(x, **{'a': 1})", "escape"),
    # ... and as the keys of a Config's kwargs or a heuristic's values, which the launch receives
    ("c = triton.Config({'B': 64, 'ir_override': '/tmp/k.ttgir'}, num_warps=4)", "escape"),
    ("O = {'extern_libs': {}}\nc = triton.Config({**O, 'B': 64})", "escape"),
    ("K = 'ptx_' + 'options'\nc = triton.Config(kwargs={K: '-O0'})", "escape"),
    ("def p(args):\n    return '-O0'\n@triton.heuristics(values={'ptx_options': p})\n@triton.jit\ndef k(x):\n"
     "    pass", "escape"),
    ("def p(args):\n    return 64\nV = {'B': p}\n@triton.heuristics(V)\n@triton.jit\ndef k(x, B: tl.constexpr):\n"
     "    pass", "escape"),
])
def test_adversaries_are_refused_at_the_rules(code, rule):
    rep = refused(code)
    assert rep.rule == rule, (code, rep)


def test_the_first_refusal_with_a_family_names_the_rejection():
    """A module bound to a name is refused, and so is what the name reaches, by its family; where several
    refusals have families, the first by line."""
    assert refused("c = torch.cuda\ns = c.Stream()").rule == "stream"
    assert refused("import time\nimport threading").rule == "timer"
    assert refused("import threading\nimport time").rule == "lazy-output"
    assert refused("class K:\n    pass\nk = K()\nk.x = 1").rule == "language"


# --- the lists hold the installed torch and Triton --------------------------------------------------------

def test_every_listed_member_exists_and_no_module_hides_behind_a_member():
    import math
    import types

    import torch
    import triton
    import triton.language  # noqa: F401
    import triton.language.extra.cuda  # noqa: F401
    import triton.language.extra.libdevice  # noqa: F401

    from rules.host_language import MODULE_MEMBERS
    from rules.triton_language import KERNEL_MODULE_MEMBERS

    roots = {"torch": torch, "triton": triton, "math": math}
    for tree in (MODULE_MEMBERS, KERNEL_MODULE_MEMBERS):
        for path, members in tree.items():
            obj = roots[path.split(".")[0]]
            for part in path.split(".")[1:]:
                obj = getattr(obj, part)
            assert isinstance(obj, types.ModuleType), path
            for name in members:
                value = getattr(obj, name)  # raises where the list names what is not there
                assert not isinstance(value, types.ModuleType) or f"{path}.{name}" in tree, (path, name)


def test_every_public_name_of_triton_language_is_a_decision():
    """A new Triton's names fail here until they are listed as a kernel's or refused."""
    import types

    import triton.language as tl
    import triton.language.extra.cuda as cuda
    from triton.language.extra import libdevice

    from rules.triton_language import LIBDEVICE, TL_CUDA, TL_MATH, TL_MEMBERS, TL_REFUSED

    public = {a for a in dir(tl) if not a.startswith("_")}
    assert public <= TL_MEMBERS | TL_REFUSED, sorted(public - TL_MEMBERS - TL_REFUSED)
    assert not TL_MEMBERS & TL_REFUSED
    assert {a for a in dir(tl.math) if not a.startswith("_") and not isinstance(getattr(tl.math, a),
                                                                                 types.ModuleType)} >= TL_MATH
    assert {a for a in dir(cuda) if not a.startswith("_")} - TL_CUDA <= {"globaltimer", "gdc", "utils"}
    assert {a for a in dir(libdevice) if not a.startswith("_")} == LIBDEVICE


def test_no_listed_attribute_reaches_a_module_frame_or_code_from_the_values_a_candidate_holds():
    import types

    import torch
    import triton
    import triton.language as tl

    from rules.host_language import VALUE_ATTRS

    @triton.jit
    def k(x, B: tl.constexpr):
        pass

    def f():
        pass

    values = [torch.empty(2, 2), torch.empty(2), torch.device("cpu"), torch.float32, torch.finfo(torch.float32),
              torch.Size([2]), {}, [], (), "s", 3, 1.5, f, k, triton.Config({"B": 4}), (i for i in ()),
              triton.autotune(configs=[triton.Config({"B": 4})], key=[])(k), torch.Tensor, torch.empty]
    bad = (types.ModuleType, types.FrameType, types.CodeType, types.TracebackType, types.GeneratorType)
    for v in values:
        for name in VALUE_ATTRS:
            try:
                got = getattr(v, name)
            except Exception:  # noqa: BLE001 - a name another kind of value has (mT on a vector, ...)
                continue
            assert not isinstance(got, bad), (type(v).__name__, name, type(got).__name__)
            assert not (isinstance(got, dict) and "__builtins__" in got), (type(v).__name__, name)


@pytest.mark.parametrize("name,words", [
    ("lang_format_frames", "attribute 'format'"),  # str.format's fields walk a running generator's frames
    ("lang_descriptor", "builtin 'property'"),     # a property in a class body does the same when read
])
def test_whole_candidates_that_read_the_caller_s_frames_are_refused(name, words):
    """Each is an honest softmax that also reads its callers' local variables (as text), which Python
    allows: the language refuses the construct that would reach them."""
    from pathlib import Path

    rep = check_source((Path(__file__).parent / "kernels" / f"{name}.py").read_text(), "softmax")
    assert not rep.ok and rep.rule == "escape" and words in rep.detail, (name, rep)


def test_the_frame_reading_tricks_work_in_plain_python():
    """What the rules refuse is a real route: the same code, run as Python, reads its caller's locals."""
    def peek():
        gen = ("{0.gi_frame.f_back.f_back.f_back.f_locals}".format(gen) for _ in (0,))
        return next(gen)

    def call():
        return peek()

    def harness():
        noise_seed = 987654321  # noqa: F841 - what the candidate reads
        return call()

    assert "987654321" in harness()
