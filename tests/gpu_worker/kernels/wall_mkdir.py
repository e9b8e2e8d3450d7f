"""Cheat (filesystem): creates a directory outside its own, with a call the guard's audit hook does
not watch (os.mkdir), so that only the operating system can refuse it."""
import os


def run(inputs, out):
    os.mkdir("/tmp/marathon-mkdir-escape")
