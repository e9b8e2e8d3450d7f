"""The harness: the Evaluator (evaluator.py) and its stages, each an object of its own (docs/harness.md,
"Where the code lives")."""

from gpu_worker.harness.evaluator import Evaluator

__all__ = ["Evaluator"]
