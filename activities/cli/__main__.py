"""`python -m activities.cli`: the same as the `marathon` console script."""

from activities.cli.main import entry

entry()
