"""phi3 and gemma2 run as llama.cpp runs them.

tests/fixtures/phi_gemma2_llamacpp.{json,npz} come from scripts/make_phi_gemma2_reference.py: tiny random GGUFs
(tests/phi_gemma2_variants.py through gguf_factory.write_tiny_model, seeded, so the files below are byte-identical
to the ones llama.cpp ran) of Phi-3 mini (fused QKV and gate/up), Phi-3.5 / Phi-4-mini (partial rotary, longrope
under a context that picks the short factors and one that picks the long ones), Gemma 2 (attention and final
logit softcapping, post-norms, even layers sliding) and its 27B's attention scale; llama.cpp's last-position
logits for prompts of about 20, 300 and 2,500 tokens under flash attention on/off and f32/f16 KV, in F32 and Q8_0
files. miro's logits must lie within 1.5x llama.cpp's own spread across those settings, plus for Q8_0 the
activation-rounding allowance test_model_reach.py and test_dense_reach.py give (0.02 native, 0.03 f32 weights).
"""

import numpy as np
import pytest
from gguf_factory import write_tiny_model
from llamacpp_reach import KV_BLOCKS, Reference
from phi_gemma2_variants import variant_kwargs

from miro.core import Engine, ModelFileError

REFERENCE = Reference("phi_gemma2_llamacpp")
REF, LOGITS, VARIANTS = REFERENCE.meta, REFERENCE.logits, REFERENCE.variants


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return REFERENCE.write_files(tmp_path_factory.mktemp("phi_gemma2"), variant_kwargs)


def test_the_fixture_covers_both_architectures_in_both_types():
    assert {(v["variant"], v["tensor_type"]) for v in VARIANTS.values()} >= {
        (a, t)
        for a in ("phi3", "phi3-longrope-short", "phi3-longrope-long", "gemma2", "gemma2-27b-layout")
        for t in ("F32", "Q8_0")
    }
    assert [len(p) for p in REF["prompts"]] == [20, 300, 2500]


def cases() -> list:
    """REFERENCE.cases(), the 27B layout's Q8_0 file in the slow tier: its three cases (46 layers, prompts up to
    2,500 tokens) took 43 of this file's 57 s, and what the Q8_0 ones add to gemma2's Q8_0 cases, the 27B
    attention scale, its F32 case checks in the fast tier too."""
    return [
        pytest.param(*case.values, id=case.id, marks=pytest.mark.slow)
        if case.id.startswith("gemma2-27b-layout-Q8_0-")
        else case
        for case in REFERENCE.cases()
    ]


@pytest.mark.parametrize("name, weights", cases())
def test_last_logits_within_llamacpps_own_spread(files, name, weights):
    engine = Engine.from_model(
        files[name], weights=weights, max_model_len=VARIANTS[name]["context"], num_kv_blocks=KV_BLOCKS
    )
    REFERENCE.check_last_logits(engine, name, weights)


def test_longrope_factors_follow_the_context_not_the_prompt(files):
    """The long factors where max_model_len exceeds the original context (4,096), the short ones otherwise, as
    llama.cpp's get_rope_factors picks them by n_ctx; the same 20-token prompt gets different logits."""
    path = files["phi3-longrope-short-F32"]
    short = Engine.from_model(path, weights="f32", max_model_len=4096, num_kv_blocks=KV_BLOCKS)
    long = Engine.from_model(path, weights="f32", max_model_len=4097, num_kv_blocks=KV_BLOCKS)
    # the file's context, 16,384: long, as llama.cpp's n_ctx 0
    default = Engine.from_model(path, weights="f32", num_kv_blocks=KV_BLOCKS)
    assert (short.model.long_factors, long.model.long_factors, default.model.long_factors) == (False, True, True)
    prompt = REF["prompts"][1]
    assert np.abs(short.logits(prompt) - long.logits(prompt)).max() > 0.05


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            dict(arch="phi3", tensor_overrides={"blk.0.ffn_gate_inp.weight": np.ones((4, 64), np.float32)}),
            "mixture-of-experts",
        ),  # PhiMoE's router under phi3's name
        (
            dict(arch="phi3", tensor_overrides={"blk.0.ffn_gate.weight": np.ones((128, 64), np.float32)}),
            "'blk.0.ffn_gate.weight'",
        ),
        (
            dict(arch="phi3", tensor_overrides={"rope_factors_long.weight": np.ones(5, np.float32)}),
            "'rope_factors_long.weight'",
        ),
        (dict(arch="phi3", metadata={"phi3.rope.scaling.type": "yarn2"}), "'yarn2'"),
        (dict(arch="phi3", metadata={"phi3.rope.dimension_count": 7}), "not an even number"),
        (dict(arch="gemma2", tensor_overrides={"output.weight": np.ones((272, 64), np.float32)}), "'output.weight'"),
        (
            dict(arch="gemma2", tensor_overrides={"blk.0.attn_q_norm.weight": np.ones(32, np.float32)}),
            "'blk.0.attn_q_norm.weight'",
        ),
        (dict(arch="gemma2", metadata={"gemma2.attn_logit_softcapping": 0.0}), "'gemma2.attn_logit_softcapping'"),
        (dict(arch="gemma2", metadata={"gemma2.final_logit_softcapping": -1.0}), "'gemma2.final_logit_softcapping'"),
    ],
)
def test_what_llamacpp_would_not_run_is_refused_in_one_sentence(tmp_path, kwargs, match):
    info = write_tiny_model(tmp_path / "f.gguf", **kwargs)
    with pytest.raises(ModelFileError, match=match) as err:
        Engine.from_model(info["path"], weights="f32")
    assert "\n" not in str(err.value)


def test_each_reads_its_own_config(tmp_path):
    from miro.core.loading.gguf_file import GGUFFile
    from miro.core.models import read_config

    def config(name, **kw):
        return read_config(GGUFFile(write_tiny_model(tmp_path / f"{name}.gguf", **kw)["path"]))

    p = config("p", **variant_kwargs("phi3-longrope-short", "F32"))
    assert (p.rope_dim, p.head_dim, p.rope_orig_context, p.rope_neox, p.rope_scaling) == (24, 32, 4096, True, "none")
    assert abs(p.rope_attn_factor - 1.0801) < 1e-4
    g = config("g", arch="gemma2", sliding_window=64)
    assert (g.sliding_window, g.attn_logit_softcap, g.final_logit_softcap, g.rope_theta_local) == (
        64,
        50.0,
        30.0,
        g.rope_theta,
    )
    assert abs(g.attention_scale - 1 / np.sqrt(32)) < 1e-9  # head_dim 32 (key_length), not dim / n_heads = 16
    g27 = config("g27", arch="gemma2", n_layers=46)
    assert abs(g27.attention_scale - 1 / np.sqrt(16)) < 1e-9
    g0 = config(
        "g0",
        arch="gemma2",
        drop_keys=(
            "gemma2.attn_logit_softcapping",
            "gemma2.final_logit_softcapping",
            "gemma2.attention.sliding_window",
        ),
    )
    assert (g0.attn_logit_softcap, g0.final_logit_softcap, g0.sliding_window) == (50.0, 30.0, 4096)  # llama.cpp's


def test_what_llamacpp_reads_when_present_loads(tmp_path):
    """Separate Q, K and V in a phi3 file (llama.cpp reads either); a longrope type key; gemma2's RoPE base for
    its local layers and a per-layer pattern."""
    rng = np.random.default_rng(0)
    separate = {
        f"blk.{i}.attn_{k}.weight": (0.05 * rng.standard_normal((n, 64))).astype(np.float32)
        for i in range(2)
        for k, n in (("q", 64), ("k", 32), ("v", 32))
    }
    for kw in (
        dict(arch="phi3", tensor_overrides=separate, drop_tensors=("blk.0.attn_qkv.weight", "blk.1.attn_qkv.weight")),
        dict(arch="phi3", metadata={"phi3.rope.scaling.type": "longrope"}),
        dict(
            arch="gemma2",
            metadata={
                "gemma2.rope.freq_base_swa": 5000.0,
                "gemma2.attention.sliding_window_pattern": [True, False, False, True],
            },
        ),
    ):
        info = write_tiny_model(tmp_path / "f.gguf", **kw)
        assert np.isfinite(Engine.from_model(info["path"], weights="f32").logits([5, 6, 7])).all()


def test_models_inspect_names_the_longrope_choice(files):
    from miro.core.loading.model_info import inspect_model

    info = inspect_model(files["phi3-longrope-short-F32"])
    assert (
        info.runs and info.rope_scaling == "none + longrope factors (the long ones where max_model_len exceeds 4,096)"
    )
    assert inspect_model(files["phi3-F32"]).rope_scaling == "none"
