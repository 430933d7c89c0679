"""The architecture registry: general.architecture picks the model class; anything else is one sentence."""

import re

import pytest
from broken_gguf import write_unsupported_arch
from gguf_factory import write_tiny_llama

from miro.core import Engine, ModelFileError
from miro.core.loading.gguf_file import GGUFFile
from miro.core.models import MODELS, LlamaModel, load_model, model_class, read_config


def test_llama_is_registered():
    assert MODELS["llama"] is LlamaModel and next(iter(MODELS)) == "llama"
    assert model_class("llama") is LlamaModel


@pytest.mark.parametrize("architecture", ["mamba", "falcon", "", "LLAMA"])
def test_unsupported_architecture_is_one_sentence_naming_it_and_the_supported_ones(architecture):
    with pytest.raises(ModelFileError) as err:
        model_class(architecture)
    message = str(err.value)
    assert message == f"architecture '{architecture}' is not supported (supported: {', '.join(MODELS)})."
    assert len(re.findall(r"\.(\s|$)", message)) == 1  # one sentence


def test_a_file_of_an_unsupported_architecture_names_the_file(tmp_path):
    path = tmp_path / "mamba.gguf"
    write_unsupported_arch(path)
    expected = rf"mamba\.gguf: architecture 'mamba' is not supported \(supported: {', '.join(MODELS)}\)\.$"
    with pytest.raises(ModelFileError, match=expected):
        read_config(GGUFFile(path))
    with pytest.raises(ModelFileError, match="architecture 'mamba' is not supported"):
        Engine.from_model(path)


def test_load_model_picks_the_class_by_architecture(tmp_path):
    info = write_tiny_llama(tmp_path / "tiny.gguf")
    model = load_model(GGUFFile(info["path"]))
    assert isinstance(model, LlamaModel) and model.config.architecture == "llama"
