"""The next dense architectures run as llama.cpp runs them: smollm3, granite, olmo2 and mistral3.

tests/fixtures/dense_llamacpp.{json,npz} come from scripts/make_dense_reference.py: tiny random GGUFs
(gguf_factory.write_tiny_model, seeded, so the files below are byte-identical to the ones llama.cpp ran) of
SmolLM3 (every fourth layer unrotated), Granite (its embedding, residual, attention and logit multipliers; and
without RoPE), OLMo 2 (post-norms, whole-vector q/k norms), OLMo 3 (sliding window, YaRN on the global layers),
Mistral Small 3.x and Ministral 3 (YaRN betas and log multiplier, attention temperature); llama.cpp's
last-position logits for prompts of about 20, 300 and 2,500 tokens under flash attention on/off and f32/f16 KV,
in F32 and Q8_0 files. miro's logits must lie within 1.5x llama.cpp's own spread across those settings (plus,
for Q8_0, a floor for the activation rounding of quantized matmuls, which every llama.cpp setting shares and
miro's f32 weights do not), as tests/core/test_model_reach.py holds the earlier layouts.
"""

import numpy as np
import pytest
from dense_variants import variant_kwargs
from gguf_factory import write_tiny_model
from llamacpp_reach import KV_BLOCKS, Reference

from miro.core import Engine

REFERENCE = Reference("dense_llamacpp")
REF, LOGITS, VARIANTS = REFERENCE.meta, REFERENCE.logits, REFERENCE.variants


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return REFERENCE.write_files(tmp_path_factory.mktemp("dense"), variant_kwargs)


def test_the_fixture_covers_every_architecture_in_both_types():
    assert {(v["variant"].split("-")[0], v["tensor_type"]) for v in VARIANTS.values()} >= {
        (a, t) for a in ("smollm3", "granite", "olmo2", "olmo3", "mistral3", "ministral3") for t in ("F32", "Q8_0")
    }
    assert [len(p) for p in REF["prompts"]] == [20, 300, 2500]


@pytest.mark.parametrize("name, weights", REFERENCE.cases())
def test_last_logits_within_llamacpps_own_spread(files, name, weights):
    engine = Engine.from_model(files[name], weights=weights, max_model_len=REF["context"], num_kv_blocks=KV_BLOCKS)
    REFERENCE.check_last_logits(engine, name, weights)


# ---- what each layout reads, and refuses -------------------------------------------------------------------


def test_a_table_of_no_columns_rotates_nothing():
    """smollm3's unrotated layers (and granite's without RoPE) pass a RoPE table of no columns to the attention
    kernel: q and k come out bit for bit as they went in, k stored as is."""
    from miro.core.layers.attention import rope_and_store_kv
    from miro.core.layers.rope import RopeParams, RopeTable

    rng = np.random.default_rng(0)
    n_heads, n_kv, hd, block = 4, 2, 16, 16
    qkv = rng.standard_normal((5, (n_heads + 2 * n_kv) * hd)).astype(np.float32)
    before = qkv.copy()
    positions = np.array([0, 1, 7, 300, 2000], dtype=np.int64)
    cos, sin = RopeTable(RopeParams(theta=10000.0, n_rot=0)).upto(positions)
    assert cos.shape == (2048, 0)
    k_cache = np.zeros((1, n_kv, hd, block), np.float32)
    v_cache = np.zeros((1, n_kv, block, hd), np.float32)
    slots = np.arange(5, dtype=np.int64)
    rope_and_store_kv(qkv, positions, cos, sin, n_heads, n_kv, hd, slots, k_cache, v_cache, False)
    assert np.array_equal(qkv, before)
    k = before[:, n_heads * hd : (n_heads + n_kv) * hd].reshape(5, n_kv, hd)
    assert np.array_equal(k_cache[0, :, :, :5].transpose(2, 0, 1), k)


def test_each_architecture_reads_its_own_config(tmp_path):
    from miro.core.loading.gguf_file import GGUFFile
    from miro.core.models import read_config

    def config(name, **kw):
        return read_config(GGUFFile(write_tiny_model(tmp_path / f"{name}.gguf", **kw)["path"]))

    assert config("s", arch="smollm3", n_layers=8).unrotated_layers == (3, 7)
    g = config("g", arch="granite")
    assert (g.logit_scale, g.residual_scale, g.embedding_scale, g.attention_scale) == (2.0, 0.5, 2.0, 0.0625)
    assert g.unrotated_layers == ()
    assert config("gn", arch="granite", metadata={"granite.rope.scaling.finetuned": False}).unrotated_layers == (0, 1)
    m = config("m", **variant_kwargs("ministral3", "F32"))
    assert (m.rope_yarn_beta_fast, m.rope_yarn_beta_slow, m.rope_yarn_log_mul) == (16.0, 2.0, 1.0)
    assert abs(m.attn_temperature_scale - 0.1) < 1e-7 and m.rope_orig_context == 1024
    o = config("o", arch="olmo2", n_layers=4, sliding_window=64)
    assert o.sliding_window == 64 and o.rope_neox
    assert config("o2", arch="olmo2").sliding_window == 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(arch="granite", drop_keys=("granite.logit_scale",)), "'granite.logit_scale' is missing"),
        (dict(arch="granite", metadata={"granite.deepstack_mapping": [-1, 1]}), "'granite.deepstack_mapping'"),
        (dict(arch="smollm3", tensor_overrides={"rope_freqs.weight": np.ones(8, np.float32)}), "'rope_freqs.weight'"),
        (
            dict(arch="smollm3", tensor_overrides={"blk.0.attn_output.bias": np.ones(64, np.float32)}),
            "'blk.0.attn_output.bias'",
        ),
        (
            dict(arch="olmo2", tensor_overrides={"blk.0.attn_norm.weight": np.ones(64, np.float32)}),
            "'blk.0.attn_norm.weight'",
        ),
        (dict(arch="olmo2", tie_embeddings=True), "'output.weight'"),
        (
            dict(
                arch="olmo2",
                head_dim=32,
                metadata={"olmo2.attention.key_length": 32, "olmo2.attention.value_length": 32},
            ),
            "olmo2 needs n_heads x head_dim",
        ),
        (
            dict(arch="mistral3", metadata={"mistral3.attention.temperature_length": 8}),
            "'mistral3.attention.temperature_length'",
        ),
    ],
)
def test_what_llamacpp_would_not_run_so_is_refused_in_one_sentence(tmp_path, kwargs, match):
    from miro.core import ModelFileError

    info = write_tiny_model(tmp_path / "f.gguf", **kwargs)
    with pytest.raises(ModelFileError, match=match) as err:
        Engine.from_model(info["path"], weights="f32")
    assert "\n" not in str(err.value)


def test_what_llamacpp_reads_when_present_loads(tmp_path):
    biases = {f"blk.0.attn_{k}.bias": np.full(n, 0.1, np.float32) for k, n in (("q", 64), ("k", 32), ("v", 32))}
    for kw in (
        dict(arch="smollm3", tensor_overrides=biases),
        dict(arch="granite", tensor_overrides={"blk.1.ffn_down.bias": np.ones(64, np.float32)}),
        dict(arch="mistral3", tensor_overrides={"rope_freqs.weight": np.ones(8, np.float32)}),
        dict(arch="mistral3", metadata={"mistral3.attention.sliding_window": 8}),  # llama.cpp ignores it too
        dict(
            arch="olmo2",
            n_layers=4,
            sliding_window=8,
            metadata={"olmo2.attention.sliding_window_pattern": [True, False, True, False]},
        ),
    ):
        info = write_tiny_model(tmp_path / "f.gguf", **kw)
        assert np.isfinite(Engine.from_model(info["path"], weights="f32").logits([5, 6, 7])).all()
