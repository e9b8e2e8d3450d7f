import subprocess


def run(inputs, out):
    subprocess.run(["true"])
