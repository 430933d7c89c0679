"""The thread-pool settings miro.core makes before numba and numpy start their pools: what they are, and that a
user's own value wins."""

import json
import os
import subprocess
import sys

import pytest

SETTINGS = {"OPENBLAS_THREAD_TIMEOUT": "4", "OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "30000"}


def imported_env(env: dict) -> dict:
    """The settings as a fresh interpreter sees them after `import miro.core`."""
    code = "import json, os, miro.core; print(json.dumps({k: os.environ.get(k) for k in %r}))" % list(SETTINGS)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_defaults_are_set_on_import():
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    assert imported_env(env) == SETTINGS


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_users_value_wins(name):
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS} | {name: "7"}
    assert imported_env(env)[name] == "7"
