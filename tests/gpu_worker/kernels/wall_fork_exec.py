"""Cheat (process): starts a shell through the C function subprocess uses, below the audit hook's
events, so that only the operating system can refuse it. The shell would leave a file behind."""
import _posixsubprocess
import os


def run(inputs, out):
    r, w = os.pipe()
    _posixsubprocess.fork_exec(
        ["/bin/sh", "-c", "echo escaped > /tmp/marathon-fork-exec.txt"], [b"/bin/sh"],
        True, (w,), None, None, -1, -1, -1, -1, -1, -1, r, w,
        True, False, -1, None, None, None, -1, None, True)
