"""The scripts under scripts/ are not a package: tests load each one from its file."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def load_script():
    """`load_script("gpu_session")`: scripts/gpu_session.py as a fresh module."""
    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load
