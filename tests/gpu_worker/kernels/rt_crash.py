import os
import signal


def run(inputs, out):
    os.kill(os.getpid(), signal.SIGSEGV)
