"""The `marathon` console script: parse, run the command, turn a refusal into one line and exit status 2."""

from __future__ import annotations

import asyncio
import os
import sys

from cli.errors import UsageError
from cli.parser import build_parser
from workflows.artifacts import ArtifactStoreError


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(args.fn(args)) or 0
    except UsageError as e:
        print(f"marathon: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _quiet_closed_pipe()
    except ArtifactStoreError as e:  # read here, a run's artifacts are often in a store this machine does not see
        print(f"marathon: error: {e} (MARATHON_ARTIFACTS, or MARATHON_HOME, names the store the workers wrote)",
              file=sys.stderr)
        return 2
    except OSError as e:  # a file or directory given that cannot be read or written
        where = f": {e.filename}" if getattr(e, "filename", None) else ""
        print(f"marathon: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _quiet_closed_pipe() -> int:
    """The reader went away (`marathon status ID | head`): end quietly, and keep the interpreter's final
    flush of stdout from raising again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError:
        pass
    return 0


def entry() -> None:
    """Console-script entry. Exits with os._exit: after a failed connection the Temporal core's
    threads can abort the interpreter during finalization, turning a clean exit 2 into a crash."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            _quiet_closed_pipe()
    os._exit(code)
