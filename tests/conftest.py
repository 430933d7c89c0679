"""Shared fixtures: the real default model, tiny GGUF files, a real redis-server."""
import os
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """Path of the real default model (SmolLM2-135M-Instruct Q4_1), pulled into the cache if needed."""
    override = os.environ.get("MIRO_TEST_GGUF")
    if override:
        return Path(override)
    from miro.core.registry import resolve_model

    return resolve_model("smollm2-135m")
