"""`miro models inspect`: a file's facts and miro's verdict from its metadata alone, as text or JSON."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from gguf_factory import write_tiny_model
from scaling_variants import variant_kwargs

MIRO = Path(sys.executable).parent / "miro"


def inspect(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(MIRO), "models", "inspect", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def test_the_default_model_runs_and_says_how(smollm2_path):
    done = inspect(smollm2_path, "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["architecture"] == "llama" and info["runs"] is True and info["refusal"] is None
    assert info["parameters"] == 134_515_008 and info["context_length"] == 8192 and info["chat_template"] is True
    assert set(info["tensor_types"]) == {"Q4_1", "Q8_0", "F32"} and abs(sum(info["tensor_types"].values()) - 1) < 1e-3
    assert info["weights"].startswith("weights: ")


def test_scaling_is_shown(tmp_path):
    path = write_tiny_model(tmp_path / "yarn.gguf", **variant_kwargs("qwen2-yarn4", "Q8_0"))["path"]
    info = json.loads(inspect(path, "--json").stdout)
    assert info["rope_scaling"] == "yarn x4 (from 1,024)" and info["context_length"] == 4096
    freqs = write_tiny_model(tmp_path / "f.gguf", **variant_kwargs("llama-rope-freqs", "F32"))["path"]
    assert "RoPE scaling none + frequency factors" in inspect(freqs).stdout


def test_a_refused_file_is_its_one_sentence_and_exit_1(tmp_path):
    path = write_tiny_model(
        tmp_path / "moe.gguf", tensor_overrides={"blk.0.ffn_up_exps.weight": np.ones((4, 4), np.float32)}
    )["path"]
    done = inspect(path)
    assert done.returncode == 1
    assert "miro runs it   no: " in done.stdout and "mixture-of-experts" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_a_missing_file_is_one_sentence(tmp_path):
    done = inspect(tmp_path / "none.gguf")
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
