import importlib


def run(inputs, out):
    importlib.import_module("baselines.softmax.baseline")
