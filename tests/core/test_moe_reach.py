"""Mixtures of experts run as llama.cpp runs them: Mixtral-style llama, qwen3moe, olmoe, granitemoe (and Granite
MoE Shared's shared expert).

tests/fixtures/moe_llamacpp.{json,npz} come from scripts/make_moe_reference.py: tiny random GGUFs
(scripts/moe_files.write_moe_model, seeded, so the files below are byte-identical to the ones llama.cpp ran) in
F32, F16 and Q8_0, and llama.cpp's last-position logits for prompts of about 20, 300 and 2,500 tokens under flash
attention on/off and f32/f16 KV. miro's logits must lie within 1.5x llama.cpp's own spread across those settings,
plus tests/llamacpp_reach.py's allowance for a quantized file. (gpt-oss, the fixture's sixth variant, has tests of
its own.) Then what the reach tests cannot see: routing ties, a row's bits alone and in a batch, the refusals.
"""

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest
from llamacpp_reach import KV_BLOCKS, Reference

from miro.core import Engine, ModelFileError
from miro.core.layers import pointwise
from miro.core.layers.moe import NORM_FLOOR, Routing, route, run_experts
from miro.core.loading.gguf_file import GGUFFile
from miro.core.loading.model_info import describe, inspect_model
from miro.core.models.mixture import load_experts
from miro.core.models.common import Loader

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from moe_files import write_moe_model  # noqa: E402

# f32 weights on a quantized file round no activation, where every llama.cpp setting rounds each to 8 bits: an
# exact float64 forward without that rounding (scripts/moe_numpy_reference.py --plain) is itself 0.040 / 0.031 from
# llama.cpp on granitemoe-Q8_0 at 20 / 300 tokens (miro f32: 0.038 / 0.031), where llama.cpp's spread is 0.029 / 0,
# so tests/llamacpp_reach.py's 0.03 for f32 gets this much more here.
F32_EXTRA = 0.01


class MoeReference(Reference):
    def allowed(self, name: str, i: int, weights: str) -> float:
        extra = F32_EXTRA if weights == "f32" and self.variants[name]["tensor_type"] != "F32" else 0.0
        return super().allowed(name, i, weights) + extra


REFERENCE = MoeReference("moe_llamacpp")
OURS = {name: v for name, v in REFERENCE.variants.items() if v["arch"] != "gpt-oss"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("moe")
    out = {}
    for name, v in OURS.items():
        path = write_moe_model(folder / f"{name}.gguf", v["variant"], v["tensor_type"])["path"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == v["sha256"], f"{name}: not the file llama.cpp ran"
        out[name] = path
    return out


def test_the_fixture_covers_every_architecture_in_every_type():
    assert {(v["arch"], v["tensor_type"]) for v in OURS.values()} == {
        (a, t) for a in ("llama", "qwen3moe", "olmoe", "granitemoe") for t in ("F32", "F16", "Q8_0")
    }
    assert [len(p) for p in REFERENCE.prompts] == [20, 300, 2500]


def _cases():
    """Every variant and weight format; F16 files in f32 weights (dense matrices a float32 copy, experts as
    stored either way) in the slow tier, to keep the default one short."""
    for case in REFERENCE.cases():
        name, weights = case.values
        if name in OURS:
            slow = weights == "f32" and OURS[name]["tensor_type"] == "F16"
            yield pytest.param(name, weights, id=case.id, marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("name, weights", list(_cases()))
def test_last_logits_within_llamacpps_own_spread(files, name, weights):
    engine = Engine.from_model(
        files[name], weights=weights, max_model_len=REFERENCE.meta["context"], num_kv_blocks=KV_BLOCKS
    )
    REFERENCE.check_last_logits(engine, name, weights)


# ---- routing -------------------------------------------------------------------------------------------------


def _route(logits, k, gating="softmax", normalize=True):
    logits = np.asarray(logits, np.float32).reshape(-1, np.shape(logits)[-1])
    chosen = np.empty((len(logits), k), np.int32)
    weights = np.empty((len(logits), k), np.float32)
    route(logits, gating == "softmax_topk", normalize, chosen, weights)
    return chosen, weights


def test_ties_go_to_the_lower_expert_index_as_llamacpps_sort_leaves_them():
    """llama.cpp's argsort (std::sort, insertion sort up to 16 elements: stable) keeps equal probabilities in
    ascending expert order; miro picks the lower index among equals for any E."""
    chosen, weights = _route([1.0, 3.0, 2.0, 3.0, 2.0, 3.0, 0.0, 2.0], 4)
    assert chosen.tolist() == [[1, 3, 5, 2]]
    assert weights[0, 0] == weights[0, 1] == weights[0, 2] > weights[0, 3]
    chosen, _ = _route(np.zeros(64), 8)  # every expert tied, E > 16
    assert chosen.tolist() == [list(range(8))]
    chosen, _ = _route([0.5, 2.0, 2.0, -1.0], 2, gating="softmax_topk")
    assert chosen.tolist() == [[1, 2]]


def test_the_weights_are_llamacpps_per_gating_and_normalisation():
    rng = np.random.default_rng(3)
    logits = (2 * rng.standard_normal((5, 16))).astype(np.float32)
    for gating, normalize in (("softmax", True), ("softmax", False), ("softmax_topk", False)):
        chosen, weights = _route(logits, 4, gating, normalize)
        for row, picked, w in zip(logits.astype(np.float64), chosen, weights):
            assert picked.tolist() == np.argsort(-row, kind="stable")[:4].tolist()
            p = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
            expected = p[picked]
            if gating == "softmax_topk":
                expected = np.exp(row[picked] - row[picked].max()) / np.exp(row[picked] - row[picked].max()).sum()
            if normalize:
                expected = expected / expected.sum()
            np.testing.assert_allclose(w, expected, rtol=1e-6)
    # the sum of the chosen weights is floored before dividing: softmax_topk's k weights sum to 1 anyway, so take
    # probabilities that underflow: all but one expert far below, and k = 2 renormalised by the floor
    _, weights = _route([0.0, -200.0, -200.0, -200.0], 2)
    assert weights[0, 0] == np.float32(1.0) / max(np.float32(1.0), NORM_FLOOR)
    assert weights[0, 1] == 0.0


# ---- batch invariance ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen3moe-Q8_0", "granitemoe-F16", "mixtral-F32"])
def test_a_rows_experts_output_is_bitwise_the_same_alone_and_in_any_batch(files, name):
    """Each expert's rows are one matrix product; a row's result must not depend on how many rows share its
    experts, which rows, or where it sits (40 varied rows: some experts get more than a tile's 16)."""
    gguf = GGUFFile(files[name])
    experts = load_experts(Loader(gguf, "native"), 0)
    routing = Routing(gguf.get(f"{gguf.get('general.architecture')}.expert_used_count"))
    rng = np.random.default_rng(7)
    batch = rng.standard_normal((40, experts.dim)).astype(np.float32)
    together = run_experts(batch, experts, routing, pointwise.silu_mul)
    for i in (0, 17, 39):
        alone = run_experts(batch[i : i + 1], experts, routing, pointwise.silu_mul)
        assert np.array_equal(alone[0], together[i])
    shuffled = rng.permutation(40)
    assert np.array_equal(run_experts(batch[shuffled], experts, routing, pointwise.silu_mul), together[shuffled])
    many = np.concatenate([batch, rng.standard_normal((300, experts.dim)).astype(np.float32)])  # several runs
    assert np.array_equal(run_experts(many, experts, routing, pointwise.silu_mul)[:40], together)


def test_an_engines_greedy_tokens_are_the_same_alone_and_batched(files):
    from miro.core import SamplingParams

    engine = Engine.from_model(files["olmoe-Q8_0"], weights="native", max_model_len=512)
    prompts = [list(range(3, 40)), list(range(50, 60)), [7] * 25, list(range(200, 100, -3))]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    together = engine.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, together):
        assert engine.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids == out.outputs[0].token_ids


# ---- what miro reads, shows and refuses ----------------------------------------------------------------------


def test_inspect_shows_the_experts_and_the_active_parameters(files):
    info = inspect_model(files["granitemoe-shared-F32"])
    assert (info.experts, info.experts_active, info.shared_expert_width) == (8, 2, 96)
    per_expert = 3 * 64 * 64
    assert info.active_parameters == info.parameters - 2 * (8 - 2) * per_expert
    assert "8 a layer, 2 active per token, plus a shared expert 96 wide" in "\n".join(describe(info))
    dense = inspect_model(files["qwen3moe-F32"])
    assert (dense.experts, dense.experts_active, dense.shared_expert_width) == (16, 4, 0)


def test_an_expert_layout_miro_does_not_run_is_refused_in_one_sentence(files):
    """A Mixtral-style file without ffn_gate_exps (llama.cpp then gates by up alone) is refused, not guessed."""
    from miro.core.models import check_model_file

    gguf_file = GGUFFile(files["mixtral-F32"])
    del gguf_file.tensors["blk.1.ffn_gate_exps.weight"]
    with pytest.raises(ModelFileError, match="'blk.1.ffn_gate_exps.weight' is missing") as err:
        check_model_file(gguf_file)
    assert "\n" not in str(err.value)


def test_a_per_layer_expert_count_is_refused_in_one_sentence(tmp_path):
    from miro.core.models.mixture import read_expert_config
    from miro.core.loading.model_config import ModelConfig

    path = write_moe_model(tmp_path / "m.gguf", "mixtral", "F32")["path"]
    gguf_file = GGUFFile(path)
    config = ModelConfig.from_gguf(gguf_file)
    gguf_file.metadata["llama.expert_used_count"] = [2, 2]
    with pytest.raises(ModelFileError, match="per-layer array") as err:
        read_expert_config(gguf_file, config)
    assert "\n" not in str(err.value)
