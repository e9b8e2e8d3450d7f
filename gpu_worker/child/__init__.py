"""The sandbox child: the process (`python -m gpu_worker.child`, child.process) and its Server, composed of
one part per concern (child.server)."""

from gpu_worker.child.core import Refused, compared_outputs  # noqa: F401 - the child's names for the worker
from gpu_worker.child.server import COMMANDS, PARTS, Server, serve  # noqa: F401
