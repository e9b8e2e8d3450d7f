"""Where the CLI keeps its state: the dev server's database and log, reports, the scoreboard, worker logs."""

from __future__ import annotations

import os
from pathlib import Path

HOME = Path(os.environ.get("MARATHON_HOME") or Path.home() / ".marathon")
