"""Cheat (process): a shell started by one of torch's own helpers, so that the innermost frame that
asks for the process is inside torch, not in the candidate."""
from torch.utils.collect_env import run as shell


def run(inputs, out):
    shell("echo escaped > /tmp/marathon-torch-shell.txt")
