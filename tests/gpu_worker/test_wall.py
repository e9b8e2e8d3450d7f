"""The OS wall around candidate children (gpu_worker.wall), the sealed guard and torch's mode stacks:
each cheat is tried for real, on CPU, and rejected with its family named; honest work still runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpu_worker import wall
from tests.gpu_worker.harnesses import KERNELS, req

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(wall._arch() is None or not sys.platform.startswith("linux"),
                                reason="the OS wall needs Linux on x86_64 or aarch64")

# Tries each act after the wall is up and prints one JSON line of outcomes. Run in its own process: a
# wall, like the audit hook, cannot be taken down again.
PROBE = r'''
import json, os, socket, subprocess, sys, threading
from gpu_worker import wall
own, outside, port, execs, no_landlock = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5] == "1"
if no_landlock:
    wall.landlock_abi = lambda: 0
desc = wall.install([own], exec_files=execs)
res = {"wall": desc}
def attempt(name, fn):
    try:
        fn()
        res[name] = "ok"
    except OSError as e:
        res[name] = f"refused errno {e.errno}"
def thread():
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
def write(path):
    with open(path, "w") as f:
        f.write("x")
attempt("thread", thread)
attempt("tcp", lambda: socket.create_connection(("127.0.0.1", port), timeout=2).sendall(b"escaped"))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
attempt("ipv6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM))
attempt("unix_pair", lambda: socket.socketpair())
attempt("unix_socket", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
attempt("subprocess", lambda: subprocess.run(["/bin/sh", "-c", f"echo x > {outside}/from-shell"], check=True))
attempt("fork", lambda: os.fork() == 0 and os._exit(0))
attempt("write_own", lambda: write(os.path.join(own, "mine.txt")))
attempt("write_outside", lambda: write(os.path.join(outside, "escaped.txt")))
attempt("mkdir_outside", lambda: os.mkdir(os.path.join(outside, "escaped-dir")))
attempt("read_outside", lambda: open(os.path.join(outside, "readable.txt")).read())
attempt("signal_parent", lambda: os.kill(os.getppid(), 0))
for e in execs:
    attempt("exec_listed", lambda: subprocess.run([e, "--version"], capture_output=True, check=True))
print(json.dumps(res))
'''


class Listener:
    """A TCP server on 127.0.0.1 that records whether anyone connected."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connected = False
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
                self.connected = True
                conn.close()
            except OSError:
                pass

    def close(self):
        self.stop = True
        self.thread.join(2)
        self.sock.close()


def probe(tmp_path, execs=(), no_landlock=False) -> tuple[dict, Listener, Path]:
    own, outside = tmp_path / "own", tmp_path / "outside"
    own.mkdir()
    outside.mkdir()
    (outside / "readable.txt").write_text("public")
    lis = Listener()
    try:
        out = subprocess.run([sys.executable, "-c", PROBE, str(own), str(outside), str(lis.port),
                              json.dumps(list(execs)), "1" if no_landlock else "0"],
                             capture_output=True, text=True, timeout=60, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        lis.close()
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), lis, outside


def test_the_wall_refuses_network_processes_and_writes_outside_and_keeps_threads(tmp_path):
    # the listener accepts a connection from this process: what refuses the probe's is its wall
    socket.create_connection(("127.0.0.1", Listener().port), timeout=2).close()
    res, lis, outside = probe(tmp_path)
    assert res["thread"] == "ok" and res["unix_pair"] == "ok" and res["write_own"] == "ok"
    assert res["read_outside"] == "ok"
    for act in ("tcp", "udp", "ipv6", "unix_socket", "subprocess", "fork", "write_outside", "mkdir_outside"):
        assert res[act].startswith("refused"), (act, res)
    assert not lis.connected
    assert sorted(p.name for p in outside.iterdir()) == ["readable.txt"]
    assert res["wall"]["process"] == "seccomp" and res["wall"]["network"].startswith("seccomp")
    if wall.landlock_abi():
        assert res["wall"]["filesystem"] == "landlock"
        if wall.landlock_abi() >= 6:  # signals to processes outside the wall (the worker) are scoped
            assert res["signal_parent"].startswith("refused")


@pytest.mark.skipif(not wall.landlock_abi(), reason="executing only listed binaries needs Landlock")
def test_with_listed_binaries_only_those_execute(tmp_path):
    """What a GPU child needs: Triton runs ptxas lazily, at a kernel's first launch, after the wall is up."""
    true = "/bin/true" if os.path.exists("/bin/true") else "/usr/bin/true"
    res, lis, outside = probe(tmp_path, execs=[true])
    assert res["exec_listed"] == "ok", res
    assert res["subprocess"].startswith("refused")  # /bin/sh is not listed
    assert res["fork"].startswith("refused") and res["tcp"].startswith("refused")
    assert os.path.realpath(true) in res["wall"]["exec"]
    assert not lis.connected and not (outside / "from-shell").exists()


# Builds a C module behind the wall, as Triton builds a kernel signature's launcher at its first launch.
C_PROBE = r'''
import ctypes, json, os, subprocess, sys
from gpu_worker import wall
own = sys.argv[1]
progs = wall.c_compiler_programs()
desc = wall.install([own], exec_files=progs)
src = os.path.join(own, "m.c")
with open(src, "w") as f:
    f.write("int answer(void) { return 42; }\n")
so = os.path.join(own, "m.so")
r = subprocess.run([progs[0], src, "-O3", "-shared", "-fPIC", "-o", so], capture_output=True, text=True,
                   env=dict(os.environ, TMPDIR=own))
res = {"rc": r.returncode, "err": r.stderr[-800:], "exec": desc["exec"]}
res["answer"] = ctypes.CDLL(so).answer() if r.returncode == 0 else None
try:
    subprocess.run(["/bin/sh", "-c", "true"], check=True)
    res["shell"] = "ok"
except OSError as e:
    res["shell"] = f"refused errno {e.errno}"
print(json.dumps(res))
'''


@pytest.mark.skipif(not wall.landlock_abi() or not wall.c_compiler_programs(),
                    reason="needs Landlock and a C compiler")
def test_the_launchers_c_compiler_builds_behind_the_wall_and_a_shell_still_does_not_run(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    out = subprocess.run([sys.executable, "-c", C_PROBE, str(own)], capture_output=True, text=True, timeout=120,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["rc"] == 0 and res["answer"] == 42, res
    if any(os.path.basename(p) in SHELLS for p in res["exec"]):
        pytest.skip("this host's C compiler is a shell script, so its shell must execute; the guard still "
                    "refuses a candidate's shell, and an unwaited process is a violation")
    assert res["shell"].startswith("refused"), res


SHELLS = ("sh", "dash", "bash")


@pytest.mark.skipif(not wall.landlock_abi(), reason="executing only listed binaries needs Landlock")
def test_a_process_whose_exec_the_wall_refused_is_still_seen(tmp_path):
    """With a GPU child's wall (the compiler listed, so the kernel lets a vfork-style clone through), a
    process started below the audit hook fails only at its exec, inside the new process, where the caller
    never hears of it: the unwaited process is what the child reports as the candidate's."""
    own = tmp_path / "own"
    own.mkdir()
    true = "/bin/true" if os.path.exists("/bin/true") else "/usr/bin/true"
    probe = ("import _posixsubprocess, json, os, sys, time\nfrom gpu_worker import wall\n"
             "from gpu_worker.child.core import _unreaped_child\n"
             "wall.install([sys.argv[1]], exec_files=[sys.argv[2]])\n"
             "before = _unreaped_child()\n"
             "r, w = os.pipe()\n"
             "_posixsubprocess.fork_exec(['/bin/sh', '-c', 'true'], [b'/bin/sh'], True, (w,), None, None, -1, -1,"
             " -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, True)\n"
             "time.sleep(0.5)\n"
             "print(json.dumps({'before': before, 'after': _unreaped_child(), 'again': _unreaped_child()}))\n")
    out = subprocess.run([sys.executable, "-c", probe, str(own), true], capture_output=True, text=True,
                         timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["before"] is None and res["again"] is None, res
    assert res["after"].startswith("pid ") and res["after"].endswith("exit status 255"), res


@pytest.mark.skipif(not wall.landlock_abi(), reason="executing only listed binaries needs Landlock")
def test_a_wrapper_script_compiler_runs_behind_the_wall_with_the_program_it_names(tmp_path):
    """A toolchain's driver may be a script that execs the real one by absolute path: the kernel executes
    the script's interpreter and that program too, so both are let through, and nothing else."""
    real = tmp_path / "libexec" / "real-cc"
    real.parent.mkdir()
    real.write_bytes(Path(os.path.realpath("/bin/true")).read_bytes())
    real.chmod(0o755)
    cc = tmp_path / "bin" / "cc"
    cc.parent.mkdir()
    cc.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    cc.chmod(0o755)
    assert str(real) in wall.exec_closure([str(cc)]) and os.path.realpath("/bin/sh") in wall.exec_closure([str(cc)])
    own = tmp_path / "own"
    own.mkdir()
    probe = ("import json, subprocess, sys\nfrom gpu_worker import wall\n"
             "d = wall.install([sys.argv[1]], exec_files=[sys.argv[2]])\n"
             "r = {'cc': subprocess.run([sys.argv[2]]).returncode}\n"
             "try:\n    subprocess.run(['/bin/ls']); r['ls'] = 'ran'\n"
             "except OSError as e:\n    r['ls'] = f'refused errno {e.errno}'\n"
             "print(json.dumps(r))\n")
    out = subprocess.run([sys.executable, "-c", probe, str(own), str(cc)], capture_output=True, text=True,
                         timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"cc": 0, "ls": "refused errno 13"}


# A GPU child's walls (guard and OS wall, as `enclose` puts them up on a CUDA host), then a candidate whose
# call reaches Triton's compiler running ptxas, and one that runs ptxas itself.
PTXAS_PROBE = r'''
import json, os, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
import torch, triton.backends.nvidia.compiler  # loaded before the walls, as in the child
from gpu_worker import wall
own = sys.argv[1]
# on a thread whose frames are all the library's (the child's are): Landlock holds for this thread
pool = ThreadPoolExecutor(1)
cc = wall.c_compiler_programs()[0]
seal, desc = pool.submit(wall.enclose, own, [], [], True, None).result()
with open(os.path.join(own, "cand.py"), "w") as f:
    f.write("from triton.backends.nvidia import compiler\n"
            "def through_triton():\n    return compiler.get_ptxas_version.__wrapped__(90)\n"
            "def by_itself(ptxas):\n    import subprocess\n"
            "    return subprocess.run([ptxas, '--version'], capture_output=True).returncode\n")
# the launcher's C compiler: only from Triton's build helper under its NVIDIA driver (here files at those
# paths stand in for them: there is no CUDA driver to build a launcher for); not from the helper alone
fake = os.path.join(own, "fake")
for rel, text in (("triton/runtime/build.py", f"import subprocess\ndef build():\n    subprocess.run([{cc!r}, '--version'], capture_output=True, check=True)\n"),
                  ("triton/backends/nvidia/driver.py", "def launcher(build):\n    build()\n")):
    os.makedirs(os.path.dirname(os.path.join(fake, rel)), exist_ok=True)
    with open(os.path.join(fake, rel), "w") as f:
        f.write(text)
def load(rel):
    import importlib.util
    spec = importlib.util.spec_from_file_location(rel.replace("/", "_")[:-3], os.path.join(fake, rel))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
build, driver = load("triton/runtime/build.py"), load("triton/backends/nvidia/driver.py")
sys.path.insert(0, own)
import cand
res = {"exec": desc.get("exec")}
for name, fn in (("through_triton", cand.through_triton), ("by_itself", lambda: cand.by_itself(desc["exec"][0])),
                 ("launcher_build", lambda: driver.launcher(build.build)), ("build_alone", build.build)):
    try:
        pool.submit(fn).result()
        res[name] = "ok"
    except Exception as e:
        res[name] = f"refused {type(e).__name__}: {e}"
print(json.dumps(res))
'''


@pytest.mark.skipif(not wall.landlock_abi() or not wall.compiler_binaries() or not wall.c_compiler_programs(),
                    reason="needs Landlock, Triton's ptxas and a C compiler")
def test_behind_a_gpu_childs_walls_triton_runs_ptxas_and_the_candidate_cannot(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    out = subprocess.run([sys.executable, "-c", PTXAS_PROBE, str(own)], capture_output=True, text=True, timeout=120,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(own)})
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["through_triton"] == "ok", res
    assert res["by_itself"].startswith("refused GuardViolation") and "process" in res["by_itself"], res
    assert res["launcher_build"] == "ok", res
    assert res["build_alone"].startswith("refused GuardViolation") and "process" in res["build_alone"], res


def test_without_landlock_seccomp_still_refuses_network_and_processes(tmp_path):
    """Seccomp cannot read paths, so without Landlock it leaves writes to the run-time guard (denying them
    all would fail every honest candidate's own exports); network and new processes stay refused."""
    res, lis, outside = probe(tmp_path, no_landlock=True)
    assert res["wall"]["filesystem"] == "guard only (no Landlock)"
    assert res["write_own"] == "ok" and res["read_outside"] == "ok" and res["thread"] == "ok"
    for act in ("tcp", "udp", "ipv6", "unix_socket", "subprocess", "fork"):
        assert res[act].startswith("refused"), (act, res)
    assert not lis.connected


def test_the_seccomp_program_is_well_formed():
    for arch in wall._ARCH.values():
        for allow_exec in (False, True):
            for deny_writes in (False, True):
                prog = wall.seccomp_program(allow_exec, deny_writes, arch)
                assert len(prog) % 8 == 0 and 0 < len(prog) // 8 < 4096


def test_a_bad_wall_setting_is_one_clear_error():
    from gpu_worker.settings import GpuWorkerSettings, SettingsError

    with pytest.raises(SettingsError, match="MARATHON_WALL='maybe': expected on, landlock, seccomp or off"):
        GpuWorkerSettings.from_env({"MARATHON_WALL": "maybe"})


def test_the_worker_start_line_names_the_wall():
    line = wall.host_summary("on")
    assert line.startswith("OS wall: seccomp")
    assert ("Landlock ABI" in line) == bool(wall.landlock_abi())
    assert "OFF" in wall.host_summary("off")


# --- candidates through the harness, static rules off: the run-time walls alone ----------------------

ESCAPES = ["/tmp/marathon-fork-exec.txt", "/tmp/marathon-mkdir-escape", "/tmp/marathon-torch-shell.txt",
           "/tmp/marathon-seal-escape.txt"]


#: what the rejection must say, where the family alone does not show which wall refused
WHY = {"wall_fork_exec": "refused by the OS wall", "wall_mkdir": "refused by the OS wall",
       "seal_swallow_and_clear": "marathon-seal-escape", "seal_unblock_imports": "import blocker",
       "seal_close_channel": "report channel was closed", "seal_patch_builtins": "builtins replaced", "lazy_function_mode": "torch modes left active",
       "lazy_dispatch_mode": "torch modes left active"}


def shell_behind_the_wall(interpreter: bool) -> bool:
    """Whether a candidate child may execute /bin/sh: where the C compiler Triton launches is a shell
    script (some hosts wrap gcc so), the wall must let its interpreter run."""
    ptxas, launcher = wall.candidate_exec_files(cuda=not interpreter)
    return os.path.realpath("/bin/sh") in wall.exec_closure(ptxas + launcher)


@pytest.mark.parametrize("name,family", [
    ("wall_fork_exec", "process"),          # below the audit hook: the OS refuses the fork
    ("wall_mkdir", "filesystem"),           # a call the audit hook does not watch: Landlock refuses it
    ("wall_shell_via_torch", "process"),    # torch's own helper starts the shell: torch frames are no pass
    ("wall_socket_local", "network"),
    ("seal_swallow_and_clear", "filesystem"),  # refusal swallowed, records emptied: the worker kept its copy
    ("seal_unblock_imports", "escape"),     # the import blocker taken out of sys.meta_path
    ("seal_close_channel", "escape"),       # the guard's channel to the worker closed, the records emptied
    ("seal_patch_builtins", "escape"),      # a builtin the guard's hook calls replaced
    ("lazy_function_mode", "lazy-output"),  # a TorchFunctionMode left on the stack
    ("lazy_dispatch_mode", "lazy-output"),  # a TorchDispatchMode left on the stack
])
def test_cheats_rejected_with_their_family(judge_raw, store, name, family):
    for p in ESCAPES:
        if os.path.isdir(p):
            os.rmdir(p)
        elif os.path.exists(p):
            os.unlink(p)
    lis = Listener()
    try:
        source = (KERNELS / f"{name}.py").read_text().replace("PORT = 0", f"PORT = {lis.port}")
        v = judge_raw.verify(req(store, source))
    finally:
        lis.close()
    assert not v.ok, name
    assert v.reason.startswith(family + ":"), v.reason
    why = WHY.get(name, "")
    if name == "wall_fork_exec" and shell_behind_the_wall(judge_raw.interpreter):
        why = "started a process of its own"  # the shell runs, its write is refused, the guard names the process
    assert why in v.reason, v.reason
    assert v.family == (family if family != "escape" else None), v
    assert not lis.connected
    assert not any(os.path.exists(p) for p in ESCAPES), [p for p in ESCAPES if os.path.exists(p)]


def test_static_rules_name_the_same_cheats():
    from rules.check import check_source

    expect = {"wall_fork_exec": "process", "wall_socket_local": "network", "lazy_function_mode": "lazy-output",
              "lazy_dispatch_mode": "lazy-output", "wall_shell_via_torch": "escape", "wall_mkdir": "escape",
              "seal_swallow_and_clear": "escape", "seal_unblock_imports": "escape", "seal_close_channel": "escape",
              "seal_patch_builtins": "escape"}
    for name, rule in expect.items():
        rep = check_source((KERNELS / f"{name}.py").read_text(), "softmax")
        assert not rep.ok and rep.rule == rule, (name, rep)


def test_the_load_reply_names_the_active_wall_and_honest_work_runs(ev_raw, store):
    from gpu_worker.canaries import canary_source
    from gpu_worker.protocol import Load
    from gpu_worker.sandbox import Sandbox

    sb = Sandbox("candidate", interpreter=True)
    try:
        r = sb.call(Load(source=canary_source("fast"), problem="softmax", shape=None), 60)
        assert r.ok and not r.violations, r
        w = r.result.wall
        assert w["os"] == "on" and w["process"] == "seccomp" and w["network"].startswith("seccomp")
        assert w["filesystem"] == ("landlock" if wall.landlock_abi() else "guard only (no Landlock)")
    finally:
        sb.close()
    v = ev_raw.verify(req(store, canary_source("fast")))
    assert v.ok, v.reason


def test_a_refusal_is_named_by_the_errno_and_place_the_wall_gives_it(tmp_path):
    import errno

    def raised(e: OSError) -> OSError:
        try:
            raise e
        except OSError as caught:
            return caught

    own = str(tmp_path)
    assert wall.family_of(raised(PermissionError(errno.EPERM, "Operation not permitted")), [own]) == "process"
    assert wall.family_of(raised(PermissionError(errno.EACCES, "Permission denied")), [own]) == "network"
    outside = raised(PermissionError(errno.EACCES, "Permission denied", "/etc/escaped"))
    assert wall.family_of(outside, [own]) == "filesystem"
    inside = raised(PermissionError(errno.EACCES, "Permission denied", os.path.join(own, "x")))
    assert wall.family_of(inside, [own]) is None  # not the wall's: a path it allows
    assert wall.family_of(raised(FileNotFoundError(errno.ENOENT, "No such file", "/nope")), [own]) is None
    wrapped = RuntimeError("kernel failed")
    wrapped.__cause__ = outside
    assert wall.family_of(wrapped, [own]) == "filesystem"
