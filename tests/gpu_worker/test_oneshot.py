"""The one-shot runner external profilers wrap (gpu_worker.oneshot): the candidate runs under the guard with
the temp directory it is given, its launches refusing Triton's compile options and its calls under the
dispatch guard, as in a sandbox child."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# writes a temp file the way Triton's compiler does (tempfile, default directory), then the output
CANDIDATE = '''
import tempfile

def run(inputs, outs):
    with tempfile.NamedTemporaryFile(mode="w", suffix=".ptx") as f:
        f.write("x")
    outs["y"].copy_(inputs["x"])
'''


def _oneshot(tmp_path, source, tmpdir):
    cand = tmp_path / "cand.py"
    cand.write_text(source)
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "gpu_worker.oneshot", str(cand), "softmax", "M16 N300", str(tmpdir)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_the_candidate_writes_temp_files_in_the_directory_it_is_given(tmp_path):
    r = _oneshot(tmp_path, CANDIDATE, tmp_path / "work")
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_write_outside_that_directory_is_refused(tmp_path):
    outside = tmp_path / "outside.txt"
    source = CANDIDATE.replace('f.write("x")', f'f.write("x")\n    open({str(outside)!r}, "w").write("x")')
    r = _oneshot(tmp_path, source, tmp_path / "work")
    assert r.returncode != 0 and "outside the sandbox's temp directory" in r.stderr
    assert not outside.exists()


def test_compile_options_and_torch_compute_are_refused_as_in_a_sandbox_child(tmp_path):
    kernels = ROOT / "tests" / "gpu_worker" / "kernels"
    r = _oneshot(tmp_path, (kernels / "heuristic_compile_options.py").read_text(), tmp_path / "work")
    assert r.returncode != 0 and "launch option ptx_options:" in r.stderr, r.stderr[-2000:]
    r = _oneshot(tmp_path, (kernels / "hidden_torch_softmax.py").read_text(), tmp_path / "work2")
    assert r.returncode != 0 and "library-kernel" in r.stderr, r.stderr[-2000:]
