"""Candidates for problems from outside the project (baselines/external/), judged by the real harness under the
Triton interpreter and by the static rules: Triton kernels of a file or folder problem, the reference's own ops
and torch composites refused, and KernelBench's ModelNew form turned into the entry function."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

FILES = Path(__file__).parent / "files"
RMSNORM = FILES / "rmsnorm.py"
LAYERNORM = FILES / "layernorm.py"
AXPY = FILES / "axpy_folder"


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    import os

    from workflows.artifacts import ArtifactStore
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler

    root = tmp_path_factory.mktemp("artifacts")
    old = os.environ.get("MARATHON_ARTIFACTS")
    os.environ["MARATHON_ARTIFACTS"] = str(root)
    store = ArtifactStore(root)
    key = "file:" + store.put_bytes(RMSNORM.read_bytes())
    ev = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=1), timeouts={"verify": 60, "compile": 60})
    yield ev, store, key
    ev.close()
    if old is None:
        os.environ.pop("MARATHON_ARTIFACTS", None)
    else:
        os.environ["MARATHON_ARTIFACTS"] = old


def _req(store, key, source):
    from workflows.contracts import EvalRequest

    return EvalRequest(problem=key, candidate_id=hashlib.sha256(source.encode()).hexdigest()[:16],
                       source_key=store.put_text(source))


def test_harness_passes_a_correct_triton_candidate_and_rejects_a_wrong_one(harness):
    ev, store, key = harness
    good = (FILES / "rmsnorm_kernel.py").read_text()
    v = ev.verify(_req(store, key, good))
    assert v.ok, v.reason
    assert v.rel_err < v.threshold and v.threshold == pytest.approx(1e-5)
    assert v.baseline_rel_err is not None and v.baseline_rel_err < 1e-6
    # the scale left out: wrong on every case
    wrong = good.replace("x * r * w", "x * r")
    w = ev.verify(_req(store, key, wrong))
    assert not w.ok and w.stage == "verify", w.reason


def test_a_kernel_ignoring_the_models_affine_parameters_is_rejected(harness):
    """LayerNorm's weight and bias vary per case: the honest kernel passes, one that leaves them out (right
    for weight 1 and bias 0, as nn.LayerNorm starts) is wrong."""
    ev, store, _ = harness
    key = "file:" + store.put_bytes(LAYERNORM.read_bytes())
    good = (FILES / "layernorm_kernel.py").read_text()
    v = ev.verify(_req(store, key, good))
    assert v.ok, v.reason
    for plain in ("d * r * w", "d * r + b", "d * r"):
        w = ev.verify(_req(store, key, good.replace("d * r * w + b", plain)))
        assert not w.ok and w.stage == "verify" and w.reason.startswith("wrong"), (plain, w.reason)


def test_harness_benchmarks_a_file_problem_against_the_eager_reference(harness):
    from workflows.contracts import BenchRequest

    ev, store, key = harness
    good = (FILES / "rmsnorm_kernel.py").read_text()
    r = _req(store, key, good)
    b = ev.benchmark(BenchRequest(problem=key, candidate_id=r.candidate_id, source_key=r.source_key))
    assert b.ok, b.reason
    assert b.baseline_name == "eager" and b.interpreter and b.time_ms > 0 and b.baseline_ms > 0
    assert {d.dist for d in b.distributions} == {"plain", "scaled"}


def test_the_reference_s_own_ops_are_refused_to_candidates(harness):
    from baselines.external.reference_ops import reference_ops
    from rules.check import check_source

    ev, store, key = harness
    assert reference_ops((FILES / "softmax.py").read_bytes()) == {"softmax"}
    assert reference_ops(RMSNORM.read_bytes()) == {"mean", "pow", "rsqrt"}
    lib = "import torch\n\ndef run(inputs, out):\n    x, w = inputs['in0'], inputs['weight']\n" \
          "    out['out0'].copy_(x * torch.rsqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + 1e-6) * w)\n"
    r = check_source(lib, key)
    assert not r.ok and r.rule == "library-kernel" and "rsqrt" in r.detail, r
    assert check_source((FILES / "rmsnorm_kernel.py").read_text(), key).ok
    assert check_source(lib, "softmax").rule == "library-kernel"  # torch that computes, for every problem


def test_softmax_file_without_parameters_through_the_harness(harness):
    import torch

    from baselines.external.file import load_file

    ev, store, _ = harness
    key, data, p = load_file(FILES / "softmax.py")
    assert p.input_names() == ["in0"] and p.shapes[0].params == {"batch_size": 16, "dim": 16384}
    x = p.make_inputs(p.cpu_shape, "scaled", 5, "cpu", cpu=True)
    assert torch.allclose(p.oracle(x)["out0"], torch.softmax(x["in0"].double(), 1), rtol=1e-12, atol=0)
    store.put_bytes(data)
    good = (FILES / "softmax_kernel.py").read_text()
    v = ev.verify(_req(store, key, good))
    assert v.ok, v.reason
    lib = "import torch\n\ndef run(inputs, out):\n    out['out0'].copy_(torch.softmax(inputs['in0'], 1))\n"
    c = ev.compile(_req(store, key, lib))
    assert not c.ok and "library-kernel" in c.error and "softmax" in c.error, c


def test_torch_composites_are_refused_for_file_problems(harness):
    """Other torch ops than the reference's own doing the work (rsqrt and sum for RMSNorm, exp, amax and sum
    for softmax, amax, exp, sum and log for logsumexp) are refused by the rules and, with the rules off, by
    the run-time guard's dispatch allowlist; the Triton candidate of the same file passes."""
    from baselines.external.file import load_file
    from gpu_worker.harness import Evaluator
    from rules.check import check_source
    from gpu_worker.device.scheduling import Scheduler

    ev, store, _ = harness
    rmsnorm = "import torch\n\ndef run(inputs, out):\n    x, w = inputs['in0'], inputs['weight']\n" \
              "    out['out0'].copy_(x * torch.rsqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + 1e-6) * w)\n"
    softmax = "import torch\n\ndef run(inputs, out):\n    x = inputs['in0']\n    e = torch.exp(x - x.amax(1, keepdim=True))\n" \
              "    out['out0'].copy_(e / e.sum(1, keepdim=True))\n"
    cheats = {"rmsnorm.py": rmsnorm, "softmax.py": softmax,
              "logsumexp.py": (FILES / "logsumexp_composed.py").read_text()}
    keys = {}
    for name, cheat in cheats.items():
        key, data, _ = load_file(FILES / name)
        store.put_bytes(data)
        keys[name] = key
        r = check_source(cheat, key)
        assert not r.ok and r.rule == "library-kernel", (name, r)
        c = ev.compile(_req(store, key, cheat))
        assert not c.ok and c.error.startswith("library-kernel"), (name, c)
    v = ev.verify(_req(store, keys["logsumexp.py"], (FILES / "logsumexp_kernel.py").read_text()))
    assert v.ok, v.reason
    raw = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0), static_rules=False,
                    timeouts={"verify": 60, "compile": 60})
    try:
        for name, cheat in cheats.items():
            v = raw.verify(_req(store, keys[name], cheat))
            assert not v.ok and v.stage == "rules", (name, v)
            assert v.reason.startswith("library-kernel") and "run-time guard" in v.reason, (name, v.reason)
    finally:
        raw.close()


# --- a problem folder's template -------------------------------------------------------------------

def test_harness_verifies_a_folder_problem_s_template(harness):
    from baselines.external.folder import folder_manifest, read_folder

    ev, store, _ = harness
    files = read_folder(AXPY)
    key, manifest = folder_manifest(files)
    for data in files.values():
        store.put_bytes(data)
    assert "folder:" + store.put_json(manifest) == key
    v = ev.verify(_req(store, key, (AXPY / "kernel.py").read_text()))
    assert v.ok, v.reason
    from rules.check import check_source

    lib = "import torch\n\ndef run(inputs, out):\n    out['y'].copy_(torch.add(inputs['z'], inputs['x'], alpha=2.5))\n"
    r = check_source(lib, key)  # the folder's own core_ops
    assert not r.ok and r.rule == "library-kernel" and "add" in r.detail, r
    wrong = (AXPY / "kernel.py").read_text().replace("2.5 * x + z", "2.0 * x + z")
    w = ev.verify(_req(store, key, wrong))
    assert not w.ok and w.stage == "verify", w.reason


# --- KernelBench's ModelNew form -------------------------------------------------------------------

MODEL_NEW = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def rms_rows(x_ptr, w_ptr, y_ptr, N, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(y_ptr + row * stride + cols, x * r * w, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_features))

    def forward(self, x):
        y = torch.empty_like(x)
        rms_rows[(x.shape[0],)](x, self.weight, y, x.shape[1], x.stride(0), self.eps,
                                BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
'''


def test_modelnew_s_methods_become_functions_of_a_dict_and_other_classes_are_left_to_the_rules():
    from baselines.external.file import load_file
    from baselines.external.model_new import entry_source
    from rules.check import check_source

    _, _, p = load_file(RMSNORM)
    helper = MODEL_NEW.replace("        y = torch.empty_like(x)\n", "        y = self.alloc(x)\n") + (
        "\n    def alloc(self, x):\n        return torch.empty_like(x)\n")
    src = entry_source(helper, p)
    assert "y = modelnew_alloc(self, x)" in src and "def modelnew_alloc(self, x):" in src, src
    assert check_source(src, "softmax").ok
    # class attributes, decorated methods: judged as written, and refused as a class
    for other in (MODEL_NEW.replace("class ModelNew(nn.Module):\n", "class ModelNew(nn.Module):\n    K = 4\n"),
                  MODEL_NEW.replace("    def forward(self, x):", "    @staticmethod\n    def forward(self, x):")):
        assert entry_source(other, p) == other
        rep = check_source(other, "softmax")  # no run(inputs, out) was derived
        assert rep.rule == "contract" and "ModelNew becomes functions only with plain methods" in rep.detail


def test_a_modelnew_candidate_is_judged_as_the_entry_function(harness):
    """KernelBench's form: ModelNew with Model's constructor and forward, turned into functions of a dict of
    its fields (the candidate language has no classes); the case's parameters replace its own (a ModelNew
    that kept its ones-initialised weight would fail), run(inputs, out) is derived."""
    from baselines.external.file import load_key
    from baselines.external.model_new import entry_source
    from rules.check import check_source

    ev, store, key = harness
    p = load_key(key, store)
    plain = (FILES / "rmsnorm_kernel.py").read_text()
    assert entry_source(plain, p) == plain  # the entry-function form is left as it is
    src = entry_source(MODEL_NEW, p)
    assert "def run(inputs, out):" in src and "class " not in src and "super()" not in src
    assert "def modelnew_init(self, num_features: int, eps: float=1e-06):" in src
    assert "self['weight'] = nn.Parameter(torch.ones(num_features))" in src and "self['eps']" in src
    assert "MARATHON_INIT_ARGS = {((256, 8192),): [8192], ((16, 200),): [200]}" in src
    assert check_source(src, key).ok  # the rules see what the harness runs
    v = ev.verify(_req(store, key, src))
    assert v.ok and v.rel_err < v.threshold, v.reason


def test_an_llm_submission_in_modelnew_form_is_stored_in_the_entry_form(harness):
    import json

    from activities.llm.calls import parse_calls
    from activities.llm.replies import Reply

    _, store, key = harness
    args = json.dumps({"source": MODEL_NEW, "rationale": "one program per row"})
    (call,), _ = parse_calls(Reply(content="", tool_calls=[{"id": "a", "name": "submit_kernel", "arguments": args}]),
                             1, key, store)
    assert call.error is None and call.rules_error is None, call
    src = store.get_text(call.source_key)
    assert "def run(inputs, out):" in src and "def modelnew_forward(self, x):" in src and "class " not in src
