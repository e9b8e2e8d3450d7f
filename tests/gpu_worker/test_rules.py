"""Static rules: each family is refused with its rule named; the project's honest kernels pass."""

import pytest

from rules.check import check_source

OK_HEAD = "import torch\nimport triton\nimport triton.language as tl\nx = torch.empty((4, 4))\n"


def src(body: str) -> str:
    return OK_HEAD + body + "\n\ndef run(inputs, out):\n    pass\n"


def test_templates_pass():
    from baselines.registry import get_problem, problem_names

    for name in problem_names():
        p = get_problem(name)
        rep = check_source(p.template(), name)
        assert rep.ok, (name, rep)


def test_canaries_slow_fast_wrong_cheat_pass_static_rules():
    from gpu_worker.canaries import CANARIES, canary_source

    for c in CANARIES:
        assert check_source(canary_source(c), "softmax").ok, c


@pytest.mark.parametrize("code,rule", [
    ("import fla", "forbidden-import"),
    ("from flash_attn import flash_attn_func", "forbidden-import"),
    ("import flashinfer", "forbidden-import"),
    ("import xformers.ops", "forbidden-import"),
    ("import vllm", "forbidden-import"),
    ("import sglang", "forbidden-import"),
    ("import deep_gemm", "forbidden-import"),
    ("import flash_mla", "forbidden-import"),
    ("import liger_kernel", "forbidden-import"),
    ("import tilelang", "forbidden-import"),
    ("from baselines.softmax import baseline", "forbidden-import"),
    ("import baselines.kda.baseline", "forbidden-import"),
    ("import numpy", "forbidden-import"),
    ("import importlib", "escape"),
    ("import ctypes", "escape"),
    ("import os", "escape"),
    ("x = __import__('fla')", "escape"),
    ("f = getattr(torch, 'soft' + 'max')", "escape"),
    ("exec('import fla')", "escape"),
    ("g = run.__globals__", "escape"),
    ("torch.cuda.Event.elapsed_time = lambda a, b: 0.001", "timer"),
    ("torch.Tensor.copy_ = None", "escape"),
    ("s = torch.cuda.Stream()", "stream"),
    ("torch.cuda.synchronize()", "stream"),
    ("import threading", "lazy-output"),
    ("import subprocess", "process"),
    ("import socket", "network"),
    ("y = torch.ops.aten.mm(a, b)", "library-kernel"),
    ("f = torch.compile(run)", "library-kernel"),
    ("y = torch.nn.functional.scaled_dot_product_attention(q, k, v)", "library-kernel"),
    ("import torch.nn.functional as F\ny = F.scaled_dot_product_attention(q, k, v)", "library-kernel"),
    ("y = torch.matmul(a, b)", "library-kernel"),
    ("y = a @ b", "library-kernel"),
    ("y = a.mm(b)", "library-kernel"),
    ("y = torch.einsum('ij,jk->ik', a, b)", "library-kernel"),
    ("from torch import bmm", "library-kernel"),
    ("y = torch.softmax(x, -1)", "library-kernel"),
    ("y = x.softmax(-1)", "library-kernel"),
    ("p = x.data_ptr()", "output-cache"),
    ("v = x._version", "output-cache"),
    ("k = id(x)", "output-cache"),
    ("class Lazy(torch.Tensor):\n    pass", "lazy-output"),
    ("class Plain:\n    pass", "language"),
    ("try:\n    pass\nexcept Exception:\n    pass", "fallback"),
    ("def f():\n    global Z\n    Z = 1", "output-cache"),
    ("s = 'fla.ops.kda'", "forbidden-import"),
])
def test_forbidden(code, rule):
    rep = check_source(src(code), "softmax")
    assert not rep.ok
    assert rep.rule == rule, rep


def test_torch_compute_refused_for_every_problem_triton_s_own_allowed():
    assert check_source(src("y = torch.softmax(x, -1)"), "kda").rule == "library-kernel"
    assert check_source(src("y = torch.exp(x)"), "kda").rule == "library-kernel"
    assert check_source(src("@triton.jit\ndef k(a):\n    c = tl.dot(a, a)"), "kda").ok
    assert check_source(src("@triton.jit\ndef k(a):\n    c = tl.exp(a).sum(axis=0)"), "softmax").ok


def test_contract_and_syntax():
    assert check_source("def run(:", "softmax").rule == "syntax"
    assert check_source("import torch\n", "softmax").rule == "contract"
    assert check_source("def run(x):\n    pass\n", "softmax").rule == "contract"


def test_rules_module_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, rules.check; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# --- attribute chains, builtins and modules: the class, not instances ------------------------------

@pytest.mark.parametrize("code,rule", [
    # the interpreter's module table, builtins and the harness, reached through torch's own attributes
    ("m = torch.sys.modules", "escape"),
    ("m = torch.cuda.os.system", "process"),
    ("m = torch.cuda.os", "escape"),
    ("m = torch.nn.functional.importlib", "library-kernel"),
    ("s = torch.multiprocessing.reductions", "process"),
    ("s = torch.functional.subprocess", "library-kernel"),
    ("s = triton.language.core.socket", "network"),
    ("c = torch.ctypes", "escape"),
    ("c = torch._C", "escape"),
    ("c = torch._C._len_torch_function_stack()", "escape"),
    ("o = torch.ops.aten", "library-kernel"),
    ("b = torch.__builtins__", "escape"),
    ("b = __builtins__", "escape"),
    ("g = torch.gpu_worker", "escape"),
    ("g = torch.activities", "escape"),
    ("g = torch.workflows", "escape"),
    # module-valued attributes of torch and Triton that are not open to candidates
    ("j = torch.jit.script", "escape"),
    ("j = torch.utils.data", "escape"),
    ("j = torch.cuda.memory.caching_allocator_alloc", "escape"),
    ("j = torch.cuda.nvtx.range_push", "escape"),
    ("j = torch.autograd.profiler", "escape"),
    ("j = torch.nn.functional.np", "library-kernel"),
    ("j = triton.runtime.driver", "escape"),
    ("from torch import jit", "escape"),
    ("from torch.cuda import memory", "escape"),
    ("import torch.utils.data", "escape"),
    # the class graph, frames and code, whatever object the chain starts from
    ("k = x.__class__.__mro__[-1].__subclasses__()", "escape"),
    ("k = x.__dict__", "escape"),
    ("k = (1).__class__", "escape"),
    ("k = int.mro()", "escape"),
    ("k = (lambda: 0).__globals__", "escape"),
    ("k = (y for y in []).gi_frame.f_back.f_globals", "escape"),
    ("k = run.fn.__globals__['torch']", "escape"),
    ("k = [torch][0].sys", "escape"),
    # builtins outside the allowlist
    ("f = getattr(torch, 'cuda')", "escape"),
    ("f = vars(torch)", "escape"),
    ("f = globals()", "escape"),
    ("f = type(x)", "escape"),
    ("f = object", "escape"),
    ("f = dir(torch)", "escape"),
    ("f = open('/etc/passwd', 'w')", "filesystem"),
    ("h = hash(x)", "output-cache"),
    # a module may not be held in a variable, passed or returned (the chain would leave the checks)
    ("m = torch", "escape"),
    ("f(triton)", "escape"),
    ("import triton.language as tl\nm = [tl]", "escape"),
    # members of allowed modules that evaluate strings or reach attributes by name
    ("import typing\nh = typing.get_type_hints(run)", "escape"),
    ("import operator\nh = operator.attrgetter('__class__')", "escape"),
    ("import functools\n@functools.lru_cache\ndef f(x):\n    return x", "escape"),
    ("from functools import cache", "escape"),
    # hooks torch or the harness would call on the candidate's objects
    ("class Lazy:\n    def __torch_function__(self, func, types, args=(), kwargs=None):\n        pass", "lazy-output"),
    ("class Lazy:\n    __torch_dispatch__ = None", "lazy-output"),
    ("class Late:\n    def __del__(self):\n        pass", "language"),
    ("def __getattr__(name):\n    return name", "escape"),
    ("from torch.overrides import TorchFunctionMode", "lazy-output"),
    ("import dataclasses\nC = dataclasses.make_dataclass('C', [], namespace={'__torch_function__': run})", "escape"),
    ("import enum\nE = enum.Enum('E', {'__torch_function__': 1})", "escape"),
    ("s = torch.cuda.cudart().cudaStreamCreate", "stream"),
    ("from torch.utils._python_dispatch import TorchDispatchMode", "lazy-output"),
    # imports beyond the allowlist, by family where there is one
    ("import numpy", "forbidden-import"),
    ("import _posixsubprocess", "process"),
    ("import time", "timer"),
    ("import tempfile", "filesystem"),
    ("import urllib.request", "network"),
    ("import weakref", "output-cache"),
    ("import json", "forbidden-import"),
])
def test_chains_builtins_and_modules_refused(code, rule):
    rep = check_source(src(code), "softmax")
    assert not rep.ok, code
    assert rep.rule == rule, (code, rep)


@pytest.mark.parametrize("code", [
    "y = torch.empty((4, 4), dtype=torch.float32, device=x.device)",
    "n = torch.cuda.get_device_properties(0).multi_processor_count",
    "b = triton.next_power_of_2(300)\nc = triton.cdiv(300, 64)",
    "@triton.jit\ndef k(a, B: tl.constexpr):\n    v = tl.math.exp(tl.load(a + tl.arange(0, B)))",
    "from triton.language.extra import libdevice",
    "z = x.select(0, 1).chunk(2)",
    "import math\nr = math.sqrt(2.0)",
    "def _helper(v):\n    return v\nq = _helper(1)",
    "def f():\n    import math\n    return math.pi\nimport math\nr = math.e",  # one name, one module, twice
])
def test_honest_constructs_pass(code):
    rep = check_source(src(code), "softmax")
    assert rep.ok, (code, rep)


def test_every_knob_setting_the_search_can_render_passes():
    """Each starting kernel, with each value of each knob checked in full, and the knob space's product:
    rendering changes only the KNOBS line and that line is a literal dict of exactly the combination's
    values (both checked on every combination of a small space, on 2,000 drawn ones of a large space), so
    every combination is constants each checked in the full source."""
    import ast
    import itertools
    import math
    import random

    from baselines.problem import KNOBS_LINE, render
    from baselines.registry import get_problem, problem_names

    for name in problem_names():
        p = get_problem(name)
        template, space = p.template(), p.knob_space()
        for knob, values in space.items():
            for v in values:
                rep = check_source(render(template, {knob: v}), name)
                assert rep.ok, (name, knob, v, rep)
        head, tail = template[:KNOBS_LINE.search(template).start()], template[KNOBS_LINE.search(template).end():]
        names = sorted(space)
        size = math.prod(len(space[n]) for n in names)
        drawn = random.Random(name)
        combos = (itertools.product(*(space[n] for n in names)) if size <= 2000 else
                  (tuple(drawn.choice(space[n]) for n in names) for _ in range(2000)))
        for combo in combos:
            out = render(template, dict(zip(names, combo)))
            m = KNOBS_LINE.search(out)
            assert out[:m.start()] == head and out[m.end():] == tail, (name, combo)
            assert ast.literal_eval(m.group(0).split("=", 1)[1].strip()) == dict(zip(names, combo)), (name, combo)


# --- a module bound to a name is refused, and so is what the name reaches, by its family -----------------

@pytest.mark.parametrize("code,rule", [
    # a stream API reached through the name is named `stream`; the binding alone is an escape
    ("cuda = torch.cuda\ns = cuda.Stream()", "stream"),
    ("cuda = torch.cuda\ndef f(s):\n    with cuda.stream(s):\n        pass", "stream"),
    ("cuda = torch.cuda\nc = cuda.is_current_stream_capturing()", "escape"),
    ("s = (torch.cuda,)\ns[0].synchronize()", "stream"),
    ("a, c = 1, torch.cuda\nc.synchronize()", "stream"),
    ("def f(c=torch.cuda):\n    return c.Event()", "stream"),
    ("def f(*, c=torch.cuda):\n    return c", "escape"),
    ("class K:\n    c = torch.cuda\nK.c.synchronize()", "stream"),
    ("class K:\n    def __init__(self):\n        self.c = torch.cuda\n    def f(self):\n        self.c.synchronize()", "stream"),
    ("for m in [torch.cuda]:\n    m.synchronize()", "stream"),
    ("ms = [torch.cuda]\nfor m in ms:\n    m.synchronize()", "stream"),
    ("x = [m.synchronize() for m in (torch.cuda,)]", "stream"),
    ("d = {'c': torch.cuda}\nd['c'].synchronize()", "stream"),
    ("if (c := torch.cuda):\n    c.synchronize()", "stream"),
    ("def g():\n    return torch.cuda\ng().synchronize()", "stream"),
    ("g = lambda: torch.cuda\ng().synchronize()", "stream"),
    ("c = torch.cuda if True else None\nc.graph", "stream"),
    ("c = torch.cuda\nd = c\nd.synchronize()", "stream"),
    ("c = torch.cuda\nk = c.os", "escape"),
    ("c = torch\nk = c.utils.data", "escape"),
    ("rt = triton.runtime", "escape"),
    ("t = triton\nd = t.runtime.driver", "escape"),
    ("tl2 = tl", "escape"),
    ("import torch.nn.functional as F\nfs = [F]", "library-kernel"),
    ("c = torch.cuda\nc.synchronize = None", "timer"),
    ("n = torch.nn\nn.functional.relu(x)", "library-kernel"),
])
def test_modules_bound_to_names_are_refused_with_what_they_reach(code, rule):
    rep = check_source(src(code), "softmax")
    assert not rep.ok, code
    assert rep.rule == rule, (code, rep)


@pytest.mark.parametrize("name,rule", [
    ("alias_module_stream", "stream"),    # cuda = torch.cuda at module level, then cuda.Stream()
    ("alias_runtime_module", "escape"),   # rt = triton.runtime
    ("torch_only_softmax", "library-kernel"),  # exp, amax, sum: torch doing the work, not torch.softmax
    ("composed_softmax", "library-kernel"),    # Triton normalises, torch.exp in run()
    ("alias_two_scopes", "escape"),       # X is torch in the module, math in a function: X.exp is torch.exp
])
def test_adversary_kernels_refused_statically(name, rule):
    from pathlib import Path

    source = (Path(__file__).parent / "kernels" / f"{name}.py").read_text()
    rep = check_source(source, "softmax")
    assert not rep.ok and rep.rule == rule, (name, rep)


def test_operators_on_tensors_pass_the_static_rules_and_are_left_to_the_run_time_guard():
    from pathlib import Path

    source = (Path(__file__).parent / "kernels" / "hidden_torch_softmax.py").read_text()
    assert check_source(source, "softmax").ok  # test_protocol holds the guard to refusing it


# --- torch in a candidate: allocate, view, copy, cast, fill; nothing that computes ---------------------

@pytest.mark.parametrize("code", [
    "y = torch.rsqrt(x)",
    "y = x.sum(-1)",
    "y = x.amax(-1, keepdim=True)",
    "y = (x - 1).exp()",
    "y = torch.exp(x)",
    "f = torch.exp",
    "from torch import exp",
    "y = torch.Tensor.sum(x)",
    "y = torch.cat([x, x])",
    "y = torch.where(x > 0, x, 0)",
    "y = x.gather(0, i)",
    "y = x.cumsum(0)",
    "y = x.argsort()",
    "v = x.item()",
    "v = x.tolist()",
    "y = torch.nn.functional.relu(x)",
    "import torch.nn.functional as F\ny = F.layer_norm(x, (4,))",
    "y = torch.special.erf(x)",
    "y = torch.fft.fft(x)",
    "y = torch.nn.Linear(4, 4)",
    "y = torch.some_op_torch_may_add(x)",
])
def test_torch_that_computes_is_refused(code):
    rep = check_source(src(code), "softmax")
    assert not rep.ok and rep.rule == "library-kernel", (code, rep)


@pytest.mark.parametrize("code", [
    "y = torch.empty((4, 4), device=x.device)\nz = torch.zeros_like(y)\nw = torch.full((2,), 1.5)",
    "y = x.view(-1).reshape(2, -1).permute(1, 0).contiguous().to(torch.float16)",
    "y = x.new_empty((3,))\ny.fill_(0)\ny.zero_()\ny.copy_(x[:3])\nz = y.clone().unsqueeze(0).expand(2, 3)",
    "parts = x.split(2)\nfirst, *rest = x.unbind(0)\nz = x.narrow(0, 0, 1).squeeze(0)",
    "n = -torch.finfo(torch.float32).max",
    "p = torch.nn.Parameter(torch.ones(3), requires_grad=False)",
    "s = set()\nl = [3, 1]\nl = sorted(l)",
    "import math\nr = math.exp(1.0) + math.log2(3.0)",
    "b = (300).bit_length()",
])
def test_torch_that_allocates_views_copies_casts_and_fills_passes(code):
    rep = check_source(src(code), "softmax")
    assert rep.ok, (code, rep)


def test_the_run_time_allowlist_is_told_to_proposers():
    from activities.llm.prompt import SYSTEM_PROMPT
    from rules.torch_ops import ALLOWED_ATEN_OPS, TORCH_RULE

    assert TORCH_RULE in SYSTEM_PROMPT
    assert {"empty", "view", "copy_", "_to_copy", "fill_", "zero_"} <= ALLOWED_ATEN_OPS
    assert not {"exp", "sum", "amax", "add", "mul", "cat", "index", "_local_scalar_dense", "set_"} & ALLOWED_ATEN_OPS


def test_profiler_cross_check_refuses_every_kernel_that_is_not_the_candidate_s_triton():
    from gpu_worker.timing import foreign_kernels

    own = ["_softmax_online", "_softmax_single"]
    assert foreign_kernels(["_softmax_online"], own) == []
    # torch's own kernels launched by the work: an elementwise exp, a reduction, a library GEMM
    exp = "void at::native::vectorized_elementwise_kernel<4, at::native::exp_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::exp_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>)"
    red = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4>)"
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
    assert foreign_kernels(["_softmax_online", exp, red, gemm], own) == sorted([exp, red, gemm])
    # by exact name: a Triton kernel named like part of torch's does not make torch's kernel its own
    assert foreign_kernels([exp], ["vectorized_elementwise_kernel", "exp_kernel_cuda"]) == [exp]
    assert foreign_kernels(["_softmax_online_2"], own) == ["_softmax_online_2"]


def test_profiler_cross_check_allows_the_fills_and_copies_the_guard_allows():
    from gpu_worker.timing import foreign_kernels

    own = ["_softmax_online"]
    fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)"
    cast = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1>)"
    assert foreign_kernels(["_softmax_online", fill, cast, "Memset (Device)", "Memcpy DtoD (Device -> Device)"],
                           own) == []
    # the marker counts only in torch's namespace: no Triton kernel's name can start there
    assert foreign_kernels(["FillFunctor_kernel"], own) == ["FillFunctor_kernel"]
    assert foreign_kernels(["Memcpy DtoH (Device -> Pageable)"], own) == ["Memcpy DtoH (Device -> Pageable)"]
