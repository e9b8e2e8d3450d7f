"""A second module holding the sample's autotuner under another name (as a library re-exports a kernel)."""

from tests.baselines.autotune_sample import double as renamed  # noqa: F401
