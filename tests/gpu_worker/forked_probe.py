"""`python -m tests.gpu_worker.forked_probe OUT [EXIT]`: writes what the process it runs in looks like to
OUT (JSON), then exits with EXIT, or waits to be killed where EXIT is `wait` (test_forkserver)."""

import json
import os
import sys
import time

preloaded = "torch" in sys.modules  # before this module imported anything
import triton  # noqa: E402

out, exit_with = sys.argv[1], sys.argv[2]
report = {"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid(),
          "sid": os.getsid(0), "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")),
          "stdin": os.readlink("/proc/self/fd/0"), "preloaded": preloaded,
          "interpret": bool(triton.knobs.runtime.interpret), "path0": sys.path[0]}
with open(out + ".tmp", "w") as f:
    json.dump(report, f)
os.rename(out + ".tmp", out)
if exit_with == "wait":
    time.sleep(600)
sys.exit(int(exit_with))
