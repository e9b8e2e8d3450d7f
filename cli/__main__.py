"""`python -m cli`: the same as the `marathon` console script."""

from cli.main import entry

entry()
