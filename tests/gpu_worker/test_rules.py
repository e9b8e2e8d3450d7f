"""Static rules: each family is refused with its rule named; the project's honest kernels pass."""

import pytest

from gpu_worker.rules import check_source

OK_HEAD = "import torch\nimport triton\nimport triton.language as tl\n"


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
    ("torch.cuda.Event.elapsed_time = lambda a, b: 0.001", "escape"),
    ("torch.Tensor.copy_ = None", "escape"),
    ("s = torch.cuda.Stream()", "stream"),
    ("torch.cuda.synchronize()", "stream"),
    ("import threading", "thread"),
    ("import subprocess", "thread"),
    ("import socket", "thread"),
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
    ("class Lazy(torch.Tensor):\n    pass", "tensor-subclass"),
    ("try:\n    pass\nexcept Exception:\n    pass", "fallback"),
    ("def f():\n    global Z\n    Z = 1", "output-cache"),
    ("s = 'fla.ops.kda'", "forbidden-import"),
])
def test_forbidden(code, rule):
    rep = check_source(src(code), "softmax")
    assert not rep.ok
    assert rep.rule == rule, rep


def test_softmax_op_allowed_for_other_problems_but_matmul_never():
    assert check_source(src("y = torch.softmax(x, -1)"), "kda").rule == "library-kernel"  # kda bans softmax too
    assert check_source(src("y = torch.exp(x)"), "softmax").ok
    assert check_source(src("@triton.jit\ndef k(a):\n    c = tl.dot(a, a)"), "kda").ok


def test_contract_and_syntax():
    assert check_source("def run(:", "softmax").rule == "syntax"
    assert check_source("import torch\n", "softmax").rule == "contract"
    assert check_source("def run(x):\n    pass\n", "softmax").rule == "contract"


def test_rules_module_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, gpu_worker.rules; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
