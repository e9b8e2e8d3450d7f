"""A KernelBench-format file becomes a problem (baselines/external/): inputs, oracle, baseline, tolerance,
the registry's store key, bad files, CPU-run checks, and `marathon start` with a file or a problem folder."""
from __future__ import annotations

import argparse
import hashlib
import shutil
from pathlib import Path

import pytest

FILES = Path(__file__).parent / "files"
RMSNORM = FILES / "rmsnorm.py"
LAYERNORM = FILES / "layernorm.py"


def problem(path=RMSNORM):
    from baselines.external.file import load_file

    return load_file(path)[2]


def write(tmp_path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_rmsnorm_file_is_a_problem():
    from baselines.external.file import CPU_SHAPE, GPU_SHAPE

    p = problem()
    assert p.name.startswith("file:") and p.name == "file:" + hashlib.sha256(RMSNORM.read_bytes()).hexdigest()
    assert [s.name for s in p.shapes] == [GPU_SHAPE] and p.cpu_shape.name == CPU_SHAPE
    assert p.shapes[0].params == {"batch_size": 256, "features": 8192}
    assert p.distributions == ("plain", "scaled") and p.outputs == ("out0",)
    assert p.input_names() == ["in0", "weight"]
    assert p.output_specs(p.shapes[0])["out0"].shape == (256, 8192)
    assert p.output_specs(p.cpu_shape, cpu=True)["out0"].shape == (16, 200)
    assert (p.tolerance_floor, p.tolerance_alpha) == (1e-5, 2.0)
    assert "oracle: the Model in float64" in p.description and "baseline: eager" in p.description
    # the floor from FLOPS and BYTES_MOVED: 1 TB/s moves BYTES_MOVED in this many ms
    assert p.floor_ms(p.shapes[0], 1e12, 1e15) == pytest.approx(1e3 * 4 * (2 * 256 * 8192 + 8192) / 1e12)
    assert list(p.baselines())[0] == "eager"


def test_inputs_seeds_and_scaled_distribution():
    import torch

    from baselines.external.file import SCALE

    p = problem()
    a = p.make_inputs(p.cpu_shape, "plain", 1, "cpu", cpu=True)
    assert torch.equal(a["in0"], p.make_inputs(p.cpu_shape, "plain", 1, "cpu", cpu=True)["in0"])
    b = p.make_inputs(p.cpu_shape, "plain", 2, "cpu", cpu=True)
    assert not torch.equal(a["in0"], b["in0"]) and not torch.equal(a["weight"], b["weight"])  # Model per seed
    s = p.make_inputs(p.cpu_shape, "scaled", 1, "cpu", cpu=True)
    assert torch.equal(s["in0"], a["in0"] * SCALE) and torch.equal(s["weight"], a["weight"])  # parameters as drawn
    g = p.make_inputs(p.shapes[0], "plain", 0, "cpu")
    assert g["in0"].shape == (256, 8192) and g["in0"].dtype == torch.float32
    with pytest.raises(ValueError, match="no distribution 'wide'"):
        p.make_inputs(p.cpu_shape, "wide", 1, "cpu", cpu=True)


def test_oracle_is_float64_and_the_baseline_errs_against_it():
    import torch

    from baselines.problem import rel_rms

    p = problem()
    x = p.make_inputs(p.cpu_shape, "scaled", 3, "cpu", cpu=True)
    ref = p.oracle(x)["out0"]
    assert ref.dtype == torch.float64 and p.oracle_dtype == "float64"
    hand = x["in0"].double() * torch.rsqrt(x["in0"].double().pow(2).mean(-1, keepdim=True) + 1e-6) * x["weight"].double()
    assert torch.allclose(ref, hand, rtol=1e-12, atol=0)
    err = rel_rms(ref, p.baselines()["eager"](x)["out0"])
    assert 0 < err < 1e-6  # fp32 eager against the fp64 oracle: the tolerance is max(1e-5, 2 x this)


def test_oracle_falls_back_to_float32_and_says_so(tmp_path):
    import torch

    f = write(tmp_path, "no_double.py", """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        if x.dtype == torch.float64:
            raise RuntimeError("no float64 kernel for this op")
        return x.relu()

def get_inputs():
    return [torch.randn(8, 8)]

def get_cpu_inputs():
    return [torch.randn(4, 4)]
""")
    p = problem(f)
    assert not p.has_floor and "physical floor skipped" in p.description and p.floor_ms(p.shapes[0], 1e12, 1e15) == 0
    # decided when the problem loads (on the CPU inputs), so every process describes the same oracle
    assert p.oracle_dtype == "float32" and "float64 failed" in p.description
    out = p.oracle(p.make_inputs(p.cpu_shape, "plain", 0, "cpu", cpu=True))["out0"]
    assert out.dtype == torch.float32 and p.oracle_dtype == "float32"
    assert "oracle: the Model in float32 (float64 failed: RuntimeError: no float64 kernel" in p.description
    # without CPU inputs the first oracle call decides
    q = problem(write(tmp_path, "no_double_gpu.py", f.read_text().replace("def get_cpu_inputs", "def other")))
    assert q.oracle_dtype == "float64"
    assert q.oracle(q.make_inputs(q.shapes[0], "plain", 0, "cpu"))["out0"].dtype == torch.float32
    assert q.oracle_dtype == "float32" and "float64 failed" in q.description


GOOD_TAIL = "\ndef get_inputs():\n    return [torch.randn(4, 4)]\n"
MODEL = "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n        return x * 2\n"


@pytest.mark.parametrize("text, message", [
    ("import torch\n" + GOOD_TAIL, "defines no class Model(nn.Module)"),
    (MODEL, "defines no get_inputs()"),
    (MODEL + GOOD_TAIL + "def broken(:\n", "syntax error at line"),
    (MODEL + "\ndef get_inputs():\n    return [torch.randn(4), 3]\n", "get_inputs() item 1 is a int, not a tensor"),
    (MODEL + GOOD_TAIL + "raise ValueError('bad import')\n", "running the file raised ValueError: bad import"),
    (MODEL.replace("return x * 2", "return 7") + GOOD_TAIL, "must return a tensor or a tuple of tensors"),
    (MODEL + GOOD_TAIL + "FLOPS = -1\n", "FLOPS must be a positive number"),
    (MODEL.replace("return x * 2", "return x.cuda() * 2") + GOOD_TAIL, "the reference raised"),  # CPU host
    (MODEL + GOOD_TAIL + "REFRESH = 'no'\n", "REFRESH must be True or False, got 'no'"),
    (b"\xff\xfe", "not a UTF-8 Python file"),
])
def test_bad_files_get_one_clear_error(tmp_path, text, message):
    from baselines.problem import ProblemFileError

    f = tmp_path / "bad.py"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ProblemFileError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        problem(f)
    assert "\n" not in str(e.value)


def test_integer_inputs_have_no_scaled_distribution(tmp_path):
    import torch

    p = problem(write(tmp_path, "ints.py", MODEL + "\ndef get_inputs():\n    return [torch.randint(0, 9, (4, 4))]\n"))
    assert p.distributions == ("plain",) and p.output_specs(p.shapes[0])["out0"].dtype == "int64"
    assert p.make_inputs(p.shapes[0], "plain", 0, "cpu")["in0"].dtype == torch.int64


def test_timing_perturbs_every_float_tensor_and_refresh_false_turns_it_off(tmp_path):
    """A perturbed set: every float input and the Model's parameters times relative noise (shapes, dtypes,
    signs kept), integer inputs as drawn, other answers; REFRESH = False: the drawn set itself."""
    import torch

    p = problem()
    x = p.make_inputs(p.cpu_shape, "plain", 3, "cpu", cpu=True)
    y = p.perturbed(x, torch.Generator().manual_seed(1), "plain")
    for n in ("in0", "weight"):
        assert y[n].shape == x[n].shape and y[n].dtype == x[n].dtype
        assert (y[n] != x[n]).all() and torch.equal(y[n] > 0, x[n] > 0), n
    assert not torch.allclose(p.oracle(y)["out0"], p.oracle(x)["out0"], rtol=1e-2)

    mixed = MODEL.replace("def forward(self, x):\n        return x * 2",
                          "def forward(self, x, i):\n        return x * 2 + i")
    q = problem(write(tmp_path, "mixed.py", mixed + "\ndef get_inputs():\n    return [torch.randn(1, 7), "
                                                    "torch.randint(0, 9, (1, 7))]\n"))
    a = q.make_inputs(q.shapes[0], "plain", 0, "cpu")
    b = q.perturbed(a, torch.Generator().manual_seed(2), "plain")
    assert (b["in0"] != a["in0"]).all() and b["in1"] is a["in1"]

    off = problem(write(tmp_path, "off.py", MODEL + GOOD_TAIL + "REFRESH = False\n"))
    z = off.make_inputs(off.shapes[0], "plain", 0, "cpu")
    assert off.perturbed(z, torch.Generator().manual_seed(3), "plain") is z


def test_a_models_parameters_vary_per_case_from_its_own_initialisation():
    """nn.LayerNorm starts at weight 1 and bias 0: per case they are scaled and shifted (the same for the
    same seed, whatever the distribution), so a kernel that ignores them fails."""
    import torch

    p = problem(LAYERNORM)
    assert p.input_names() == ["in0", "ln.weight", "ln.bias"]
    a, b = (p.make_inputs(p.cpu_shape, "plain", s, "cpu", cpu=True) for s in (1, 2))
    for n in ("ln.weight", "ln.bias"):
        assert not torch.equal(a[n], b[n]), n
        assert torch.equal(a[n], p.make_inputs(p.cpu_shape, "scaled", 1, "cpu", cpu=True)[n]), n
    assert (a["ln.weight"] > 0).all() and float((a["ln.weight"] - 1).abs().mean()) > 0.1
    assert float(a["ln.bias"].abs().mean()) > 0.03


def test_cpu_run_checks(tmp_path):
    from baselines.external.file import check_cpu_run
    from baselines.problem import ProblemFileError

    check_cpu_run(problem())  # the RMSNorm has CPU inputs and a deterministic reference
    with pytest.raises(ProblemFileError, match="defines no get_cpu_inputs"):
        check_cpu_run(problem(write(tmp_path, "nocpu.py", MODEL + GOOD_TAIL)))
    noisy = MODEL.replace("return x * 2", "return x + torch.rand_like(x)") + GOOD_TAIL + \
        "\ndef get_cpu_inputs():\n    return [torch.randn(4, 4)]\n"
    with pytest.raises(ProblemFileError, match="not deterministic"):
        check_cpu_run(problem(write(tmp_path, "noisy.py", noisy)))


def test_registry_loads_the_problem_by_its_store_key_after_the_file_is_gone(tmp_path, store):
    from baselines.registry import UnknownProblem, check_problem_name, get_problem

    f = tmp_path / "mine.py"
    f.write_text(RMSNORM.read_text() + f"\n# {tmp_path}\n")  # content (and key) of this test alone
    key = "file:" + hashlib.sha256(f.read_bytes()).hexdigest()
    with pytest.raises(UnknownProblem, match="not found"):
        check_problem_name(key)
    assert store.put_bytes(f.read_bytes()) == key.removeprefix("file:")
    f.unlink()
    assert check_problem_name(key) == key
    p = get_problem(key)
    assert p.name == key and p.outputs == ("out0",) and "get_cpu_inputs" in p.mod.__dict__
    assert (p.folder / "baseline.py").read_text().endswith(RMSNORM.read_text() + f"\n# {tmp_path}\n")


def spec_args(**kw):
    base = dict(spec=None, problem=None, iterations=None, hours=None, tokens=None, gpu_seconds=None,
                policy="llm", population=None, compact_every=None, seed=None, shape=None, model=None,
                gpu_queue=None)
    return argparse.Namespace(**{**base, **kw})


def test_start_path_stores_the_file_and_names_it_by_key(tmp_path, store):
    from cli.spec import parse_spec

    f = tmp_path / "rms.py"
    shutil.copy(RMSNORM, f)
    spec = parse_spec(spec_args(problem=str(f)))
    assert spec.problem == "file:" + hashlib.sha256(RMSNORM.read_bytes()).hexdigest()
    assert store.get_bytes(spec.problem.removeprefix("file:")) == RMSNORM.read_bytes()
    # a RunSpec that names the path works the same; the key itself is a valid problem name
    assert parse_spec(spec_args(spec='{"problem": "%s", "policy": "llm"}' % f)).problem == spec.problem
    assert parse_spec(spec_args(problem=spec.problem)).problem == spec.problem


@pytest.mark.parametrize("make, flags, message", [
    (lambda d: d / "missing.py", {}, "missing.py: no such file or folder"),
    (lambda d: d, {}, "a problem folder needs a spec.py"),
    (lambda d: write(d, "spec.py", "PROBLEM = 3\n").parent, {}, "spec.py defines no PROBLEM"),
    (lambda d: write(d, "x.py", MODEL), {}, "defines no get_inputs()"),
    (lambda d: write(d, "x.py", MODEL + GOOD_TAIL), {}, "defines no get_cpu_inputs()"),
    (lambda d: RMSNORM, ["--policy", "search"], "use --policy llm"),
])
def test_start_refuses_bad_files_with_one_line(tmp_path, store, capsys, make, flags, message):
    from cli import main

    rc = main(["start", str(make(tmp_path)), "--address", "127.0.0.1:1"] + (flags or ["--policy", "llm"]))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err
    assert not (store.root / "objects").exists()  # nothing was stored


def test_start_with_a_starting_kernel_stores_it_by_key_and_refuses_a_bad_one(tmp_path, store, capsys):
    from cli import main
    from cli.spec import parse_spec

    start = FILES / "layernorm_start.py"
    spec = parse_spec(spec_args(problem=str(LAYERNORM), kernel=str(start), policy="search"))
    assert spec.problem.startswith("file:") and spec.policy == "search"
    assert store.get_text(spec.start_kernel) == start.read_text()
    bad = write(tmp_path, "start.py", start.read_text().replace("KNOB_SPACE = ", "SPACE = "))
    for flags, message in ((["--kernel", str(bad)], f"--kernel {bad}: needs one module-level KNOB_SPACE"),
                           (["--kernel", str(tmp_path / "none.py")], "cannot read the file"),
                           (["--kernel", str(start), "--policy", "llm"], "the llm policy writes its own")):
        rc = main(["start", str(LAYERNORM), "--address", "127.0.0.1:1"] + flags)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and message in err[0], (flags, err)


# --- the richer form: a problem folder outside the project -------------------------------------------------

AXPY = FILES / "axpy_folder"


def test_start_folder_stores_it_and_the_registry_loads_it_after_the_folder_is_gone(tmp_path, store):
    import torch

    from activities.search import KnobSearch
    from baselines.registry import get_problem
    from cli.spec import parse_spec

    mine = tmp_path / "axpy"
    shutil.copytree(AXPY, mine)
    (mine / "oracle.py").write_text((AXPY / "oracle.py").read_text() + f"\n# {tmp_path}\n")  # a key of its own
    spec = parse_spec(spec_args(problem=str(mine), policy="search"))
    assert spec.problem.startswith("folder:") and len(spec.problem) == len("folder:") + 64
    shutil.rmtree(mine)
    p = get_problem(spec.problem)
    assert p.name == spec.problem and p.own_name == "axpy" and p.distributions == ("normal", "large")
    assert p.default_knobs() == {"BLOCK": 64, "num_warps": 8} and p.knob_space()["BLOCK"][0] == 64
    assert p.folder != mine and (p.folder / "kernel.py").read_text() == (AXPY / "kernel.py").read_text()
    x = p.make_inputs(p.cpu_shape, "large", 1, "cpu", cpu=True)
    assert torch.equal(p.oracle(x)["y"], 2.5 * x["x"].double() + x["z"].double())
    first = KnobSearch(p, seed=0).propose(1, 0, [], set())
    assert first.knobs == p.default_knobs() and "KNOBS = " in first.source


def test_search_on_a_folder_without_a_template_is_refused(tmp_path, store, capsys):
    from cli import main

    mine = tmp_path / "axpy"
    shutil.copytree(AXPY, mine)
    (mine / "kernel.py").unlink()
    rc = main(["start", str(mine), "--policy", "search", "--address", "127.0.0.1:1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "the search policy needs kernel.py with a KNOBS line" in err[0], err
    assert not (store.root / "objects").exists()
