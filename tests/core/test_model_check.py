"""Correct or refused: every tensor of a file and every {arch}.* key that changes the math is one miro
implements, else the file is refused in one sentence naming the tensor or key (core/loading/model_check.py).

The tensors walk gguf-py's MODEL_TENSORS for each architecture miro runs: each kind there is either read by
miro's module for it (a tiny file carrying it loads) or refused by name when a file carries it."""

import gguf
import numpy as np
import pytest
from gguf_factory import write_tiny_model

from miro.core import Engine, ModelFileError
from miro.core.loading.gguf_file import GGUFFile
from miro.core.loading.model_check import KEYS_READ, architecture_enum
from miro.core.models import read_config

MT = gguf.MODEL_TENSOR
DIM, HEADS = 64, 4


def _shape_for(kind: MT, info: dict) -> tuple[int, ...]:
    """A plausible shape for a tensor kind that miro does not read (it is refused before its shape matters)."""
    return (
        (info["dim"],)
        if "NORM" in kind.name or "FREQS" in kind.name or "FACTORS" in kind.name
        else (info["dim"], info["dim"])
    )


def _name(kind: MT, bid: int = 0) -> str:
    base = gguf.TENSOR_NAMES[kind]
    return (base.format(bid=bid) if "{bid}" in base else base) + ".weight"


@pytest.mark.parametrize(
    "arch", ["llama", "qwen2", "qwen3", "gemma3", "smollm3", "granite", "olmo2", "mistral3", "phi3", "gemma2"]
)
def test_every_tensor_kind_of_the_layout_is_read_or_refused_by_name(tmp_path, arch):
    base = write_tiny_model(tmp_path / "base.gguf", arch=arch)
    read = set(GGUFFile(base["path"]).tensors)
    refused = []
    for kind in gguf.MODEL_TENSORS[architecture_enum(arch)]:
        name = _name(kind)
        if name in read:
            continue
        if arch in ("llama", "mistral3") and kind == MT.ROPE_FREQS:  # read: frequency factors (test_model_reach.py)
            continue
        if arch == "phi3" and kind in (MT.ROPE_FACTORS_LONG, MT.ROPE_FACTORS_SHORT):  # read: longrope
            continue
        extra = {name: np.ones(_shape_for(kind, base), np.float32)}
        info = write_tiny_model(tmp_path / f"{kind.name}.gguf", arch=arch, tensor_overrides=extra)
        with pytest.raises(ModelFileError) as err:
            Engine.from_model(info["path"], weights="f32")
        message = str(err.value)
        assert f"tensor '{name}'" in message and "\n" not in message and "Traceback" not in message
        refused.append(kind.name)
    assert refused or arch in ("olmo2", "gemma2"), (
        "a layout with nothing to refuse: the walk found no kinds"
    )  # they read all


def test_experts_are_refused_as_experts(tmp_path):
    extra = {"blk.0.ffn_gate_inp.weight": np.ones((8, DIM), np.float32)}
    info = write_tiny_model(tmp_path / "moe.gguf", tensor_overrides=extra)
    with pytest.raises(ModelFileError, match="mixture-of-experts tensors, which miro runs only where the file names"):
        Engine.from_model(info["path"])


def test_a_tensor_outside_the_layout_is_refused(tmp_path):
    info = write_tiny_model(tmp_path / "odd.gguf", tensor_overrides={"blk.0.my_adapter.weight": np.ones(4, np.float32)})
    with pytest.raises(ModelFileError, match="'blk.0.my_adapter.weight' is not part of llama.cpp's llama layout"):
        Engine.from_model(info["path"])


@pytest.mark.parametrize(
    "key, value",
    [
        ("llama.attn_logit_softcapping", 50.0),
        ("llama.expert_shared_count", 2),
        ("llama.rope.scaling.yarn_log_multiplier", 0.1),
        ("llama.residual_scale", 0.22),
        ("llama.some_future_key", 1),
    ],
)
def test_a_key_that_changes_the_math_is_refused_by_name(tmp_path, key, value):
    info = write_tiny_model(tmp_path / "k.gguf", metadata={key: value})
    with pytest.raises(ModelFileError) as err:
        read_config(GGUFFile(info["path"]))
    assert f"'{key}'" in str(err.value) and "refuses the file" in str(err.value)


@pytest.mark.parametrize(
    "key, value",
    [
        ("llama.expert_count", 0),
        ("llama.final_logit_softcapping", 0.0),
        ("llama.rope.scaling.finetuned", True),
        ("llama.attention.sliding_window", 4096),
        ("general.license", "apache-2.0"),
        ("quantize.imatrix.file", "x"),
    ],
)
def test_keys_that_change_nothing_pass(tmp_path, key, value):
    info = write_tiny_model(tmp_path / "k.gguf", metadata={key: value})
    read_config(GGUFFile(info["path"]))


@pytest.mark.parametrize("scaling, message", [("longrope", "Phi-3 longrope"), ("dynamic", "not that one")])
def test_a_rope_scaling_miro_does_not_apply_is_refused(tmp_path, scaling, message):
    info = write_tiny_model(tmp_path / "r.gguf", metadata={"llama.rope.scaling.type": scaling})
    with pytest.raises(ModelFileError, match=message):
        read_config(GGUFFile(info["path"]))


def test_partial_rotary_is_refused_as_llamacpp_refuses_it(tmp_path):
    info = write_tiny_model(tmp_path / "p.gguf", metadata={"llama.rope.dimension_count": 8})
    with pytest.raises(ModelFileError, match="partial rotary is not supported"):
        read_config(GGUFFile(info["path"]))


def test_the_real_models_pass_every_check(smollm2_path, gemma3_path, minilm_path):
    for path in (smollm2_path, gemma3_path, minilm_path):
        read_config(GGUFFile(path))


def test_every_key_read_is_a_gguf_key_or_llamacpps_old_name():
    templates = {
        v
        for group in (gguf.Keys.LLM, gguf.Keys.Attention, gguf.Keys.Rope)
        for v in vars(group).values()
        if isinstance(v, str)
    }
    assert KEYS_READ - templates == {"{arch}.rope.scale_linear"}
