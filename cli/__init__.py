"""`marathon`: the command line. The dev server, workers, and the client side of a run.

Every client command honours TEMPORAL_ADDRESS and TEMPORAL_NAMESPACE (and a temporal envconfig
profile). Bad input gets one clear line on stderr and exit status 2; nothing is started half-way.

home: MARATHON_HOME · errors: UsageError · parser: the grammar · main: the console script · server:
`marathon dev` · workers: `marathon worker` and the task queues' pollers · spec: a run's input · connection:
a run's handle, status and spec · run: start, budget, stop, pause, resume, hint · query: status, watch,
report, notebook, export · demo: what `make run` does · local: problems, verify, selftest, bench, llm-check.
"""

from cli.errors import UsageError
from cli.main import entry, main
from cli.parser import build_parser

__all__ = ["UsageError", "build_parser", "entry", "main"]
