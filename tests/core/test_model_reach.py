"""Models people bring: files in the layouts miro used to run silently wrong now run as llama.cpp runs them.

tests/fixtures/scaling_llamacpp.{json,npz} come from scripts/make_scaling_reference.py: tiny random GGUFs
(gguf_factory.write_tiny_model, seeded, so the files below are byte-identical to the ones llama.cpp ran)
with Llama 3 frequency factors, linear and YaRN RoPE scaling, llama biases, Gemma 3's scaled global layers,
27B attention scale and logit softcapping, and the keys llama.cpp's llama graph ignores; llama.cpp's
last-position logits for prompts of 20, 300 and 2,500 tokens under flash attention on/off and f32/f16 KV.
miro's logits must lie within 1.5x llama.cpp's own spread across those settings, plus the activation rounding
allowance of tests/llamacpp_reach.py. Files are F32 (miro f32 against llama.cpp's float path) and Q8_0 (both
weight formats).
"""

import pytest
from llamacpp_reach import KV_BLOCKS, Reference
from scaling_variants import variant_kwargs

from miro.core import Engine

REF = Reference("scaling_llamacpp")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return REF.write_files(tmp_path_factory.mktemp("reach"), variant_kwargs)


@pytest.mark.parametrize("name, weights", REF.cases())
def test_last_logits_within_llamacpps_own_spread(files, name, weights):
    engine = Engine.from_model(files[name], weights=weights, max_model_len=REF.meta["context"], num_kv_blocks=KV_BLOCKS)
    REF.check_last_logits(engine, name, weights)
