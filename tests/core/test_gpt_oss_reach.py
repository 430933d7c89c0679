"""gpt-oss runs as llama.cpp runs it (core/models/gpt_oss.py): MXFP4 experts with biases and SwiGLU-OAI, a router
with a bias and a softmax over the chosen k, attention sinks, even layers sliding over 128 positions, YaRN.

tests/fixtures/moe_llamacpp.{json,npz} (scripts/make_moe_reference.py) hold llama.cpp's last-position logits for
scripts/moe_files.py's tiny random gpt-oss files (F32, F16 and Q8_0 for everything but the experts, which are
MXFP4 in each, as gpt-oss's converter stores them) at about 20, 300 and 2,500 tokens under flash attention on/off
and f32/f16 KV. miro's logits must lie within 1.5x llama.cpp's own spread plus tests/llamacpp_reach.py's
allowance for the 8-bit rounding of a quantized matmul's activations, which counts for every gpt-oss file: its
MXFP4 experts round their inputs to Q8_0 in llama.cpp whatever the other tensors are (scripts/moe_math.md,
section 7), and miro's experts run on the file's types, so they round them too, in f32 weights as well.
The file is small enough that every case, 2,500-token prompts included, takes about a second once compiled. Then
the parts on their own: the gate, the config read, the refusals, the chat template.
"""

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest
from fixture_files import FIXTURES
from llamacpp_reach import ACTIVATION_ROUNDING, KV_BLOCKS, SPREAD_MULTIPLE, Reference

from miro.core import Engine, ModelFileError
from miro.core.layers import pointwise
from miro.core.loading.gguf_file import GGUFFile
from miro.core.models import check_model_file, read_config
from miro.core.tokenizers.tokenizer import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from moe_files import write_moe_model  # noqa: E402


class GptOssReference(Reference):
    def allowed(self, name: str, i: int, weights: str) -> float:
        """Quantized whatever the file's type: its experts are MXFP4 (the fixture's expert_tensor_type)."""
        v = self.variants[name]
        assert v["expert_tensor_type"] == "MXFP4"
        return SPREAD_MULTIPLE * v["spread_vs_reference"][i] + ACTIVATION_ROUNDING[weights]


REFERENCE = GptOssReference("moe_llamacpp")
OURS = {name: v for name, v in REFERENCE.variants.items() if v["arch"] == "gpt-oss"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt-oss")
    out = {}
    for name, v in OURS.items():
        path = write_moe_model(folder / f"{name}.gguf", v["variant"], v["tensor_type"])["path"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == v["sha256"], f"{name}: not the file llama.cpp ran"
        out[name] = path
    return out


@pytest.fixture(scope="module")
def engines(files):
    """One engine per file and weight format, made when a test first asks for it."""
    made = {}

    def get(name, weights):
        if (name, weights) not in made:
            made[name, weights] = Engine.from_model(
                files[name], weights=weights, max_model_len=REFERENCE.meta["context"], num_kv_blocks=KV_BLOCKS
            )
        return made[name, weights]

    return get


def test_the_fixture_has_gpt_oss_in_every_type():
    assert {v["tensor_type"] for v in OURS.values()} == {"F32", "F16", "Q8_0"}
    assert [len(p) for p in REFERENCE.prompts] == [20, 300, 2500]


@pytest.mark.parametrize(
    "name, weights, i",
    [
        pytest.param(name, weights, i, id=f"{name}-{weights}-p{i}")
        for name in OURS
        for weights in ("f32", "native")
        for i in range(3)
    ],
)
def test_last_logits_within_llamacpps_own_spread(engines, name, weights, i):
    prompt = REFERENCE.prompts[i]
    expected = REFERENCE.logits[f"{name}/{REFERENCE.meta['reference_setting']}/p{i}"]
    diff = float(np.abs(engines(name, weights).logits(prompt) - expected).max())
    spread = OURS[name]["spread_vs_reference"][i]
    print(f"{name} {weights} p{i} ({len(prompt)} tokens): {diff:.5f} (llama.cpp's spread {spread:.5f})")
    assert diff <= REFERENCE.allowed(name, i, weights), (
        f"{name} {weights}: prompt of {len(prompt)} tokens off by {diff:.4f}, more than {SPREAD_MULTIPLE}x "
        f"llama.cpp's own spread ({spread:.4f}) and the activation rounding allowed"
    )


def test_greedy_tokens_are_the_same_alone_and_batched(engines):
    """Sinks, windows and experts keep a row's result its own: each prompt's greedy tokens alone and batched."""
    from miro.core import SamplingParams

    engine = engines("gpt-oss-Q8_0", "native")
    prompts = [list(range(3, 160)), list(range(50, 60)), [7] * 25, list(range(200, 100, -3))]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    together = engine.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, together):
        assert engine.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids == out.outputs[0].token_ids


# ---- the parts -----------------------------------------------------------------------------------------------


def test_swiglu_oai_is_ggmls_float32_steps():
    """x = min(g, 7), y = clamp(u, -7, 7), x / (1 + e^(1.702 (-x))) * (y + 1), in float32, gates past the clamp
    included."""
    rng = np.random.default_rng(0)
    gate_up = (6 * rng.standard_normal((5, 64))).astype(np.float32)
    out = pointwise.swiglu_oai(gate_up, np.empty((5, 32), np.float32))
    g, u = gate_up[:, :32], gate_up[:, 32:]
    x = np.minimum(g, np.float32(7))
    y = np.clip(u, np.float32(-7), np.float32(7))
    expected = x / (np.float32(1) + np.exp(np.float32(1.702) * -x)) * (y + np.float32(1))
    assert (g > 7).any() and (np.abs(u) > 7).any()
    np.testing.assert_allclose(out, expected, rtol=2e-7, atol=0)


def test_the_config_is_read_as_llamacpp_reads_it(files):
    gguf = GGUFFile(files["gpt-oss-F32"])
    config = read_config(gguf)
    assert (config.sliding_window, config.rope_theta_local, config.rope_neox) == (128, 150000.0, True)
    assert (config.n_expert, config.n_expert_used, config.expert_ffn_dim, config.head_dim) == (16, 4, 64, 32)
    rope = config.rope()
    assert rope.yarn and rope.freq_scale == 1 / 32 and rope.n_ctx_orig == 4096
    assert (rope.beta_fast, rope.beta_slow) == (32.0, 1.0)  # llama.cpp's, not read from the file for gpt-oss
    assert abs(rope.mscale - (1 + 0.1 * np.log(32))) < 1e-12
    model = Engine.from_model(files["gpt-oss-F32"], weights="f32", max_model_len=256).model
    assert model.local == (True, False, True, False)  # even layers slide
    assert model.routing.gating == "softmax_topk" and not model.routing.normalize
    gguf.metadata["gpt-oss.attention.sliding_window_pattern"] = [False, True, True, False]
    gguf.metadata["gpt-oss.rope.freq_base_swa"] = 10000.0
    assert read_config(gguf).rope_theta_local == 10000.0


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda g: g.metadata.pop("gpt-oss.attention.sliding_window"), "'gpt-oss.attention.sliding_window' is missing"),
        (lambda g: g.metadata.pop("gpt-oss.expert_feed_forward_length"), "expert_feed_forward_length' is missing"),
        (lambda g: g.metadata.__setitem__("gpt-oss.expert_feed_forward_length", [64] * 4), "per-layer array"),
        (lambda g: g.metadata.__setitem__("gpt-oss.expert_weights_scale", 2.5), "'gpt-oss.expert_weights_scale'"),
        (
            lambda g: g.metadata.__setitem__("gpt-oss.attention.sliding_window_pattern", [True, False]),
            "sliding_window_pattern must be 4 true/false flags",
        ),
        (lambda g: g.tensors.pop("blk.2.attn_sinks.weight"), "'blk.2.attn_sinks.weight' is missing"),
        (lambda g: g.tensors.pop("blk.0.attn_output.bias"), "'blk.0.attn_output.bias' is missing"),
        (lambda g: g.tensors.pop("blk.1.ffn_down_exps.bias"), "'blk.1.ffn_down_exps.bias' is missing"),
        (lambda g: g.tensors.pop("output.weight"), "'output.weight' is missing"),
    ],
)
def test_what_miro_does_not_run_as_llamacpp_does_is_refused_in_one_sentence(files, change, match):
    gguf = GGUFFile(files["gpt-oss-F32"])
    change(gguf)
    with pytest.raises(ModelFileError, match=match) as err:
        check_model_file(gguf)
    assert "\n" not in str(err.value)


def test_the_q_k_v_biases_may_be_left_out_as_llamacpp_allows(files):
    gguf = GGUFFile(files["gpt-oss-F32"])
    for kind in ("q", "k", "v"):
        del gguf.tensors[f"blk.0.attn_{kind}.bias"]
    check_model_file(gguf)


def test_the_harmony_chat_template_renders(files):
    """gpt-oss's chat format (harmony) comes from the file's template: llama.cpp's copy of the real one
    (models/templates/openai-gpt-oss-120b.jinja, gpt-oss-20b's too) renders through miro's tokenizer."""
    meta = dict(GGUFFile(files["gpt-oss-F32"]).metadata)
    meta["tokenizer.chat_template"] = (FIXTURES / "openai-gpt-oss-120b.jinja").read_text()
    tokenizer = Tokenizer.from_gguf_metadata(meta)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "thinking": "simple"},
        {"role": "user", "content": "And 3+3?"},
    ]
    text = tokenizer.apply_chat_template(messages, reasoning_effort="high")
    assert text.startswith("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n")
    assert "Reasoning: high\n" in text
    assert "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>" in text
    assert text.endswith(
        "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant<|channel|>final<|message|>4"
        "<|end|><|start|>user<|message|>And 3+3?<|end|><|start|>assistant"
    )
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    with_tools = tokenizer.apply_chat_template(messages[1:2], tools=tools)
    assert "namespace functions {\n\n// Weather\ntype get_weather = (_: {\ncity: string,\n}) => any;" in with_tools
