"""The fixture scripts' default model: an alias from the miro model cache ($MIRO_HOME/models, default
~/.cache/miro/models), pulled if needed by core/loading/registry.py alone, so the scripts run in reference
environments (torch, llama-cpp-python) that do not have miro's own dependencies."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cached_model(alias: str = "smollm2-135m") -> Path:
    package = types.ModuleType("_miro_core")  # a bare package for core/, so its __init__ (numba...) is not run
    package.__path__ = [str(ROOT / "core")]
    sys.modules["_miro_core"] = package
    registry = importlib.import_module("_miro_core.registry")
    return registry.resolve_model(alias, log=print)
