"""Reference logits and greedy text for the default model, from Hugging Face transformers.

Run (from the repository root, with the reference environment that has torch,
transformers and gguf; no GPU needed, a few minutes on two CPU cores):

    python scripts/make_hf_reference.py \
        [--model PATH]   # default: smollm2-135m from the miro model cache, pulled if needed

It reads ``tests/fixtures/chat_prompts.json`` (20 chat conversations) and writes:

* ``tests/fixtures/hf_reference.json``: model path and sha256, library versions,
  the config as HF reads it from the GGUF (rope theta, rms eps, tied
  embeddings, ...), and per prompt: the rendered prompt text, prompt token ids,
  the top-20 last-position logits (ids and float32 values), the top-1 id, and a
  32-token greedy continuation (ids and decoded text) with EOS ignored.
* ``tests/fixtures/hf_logits.npz``: ``logits``, float32 ``[20, 49152]``, the
  full last-position logits of each prompt (compressed).

How it computes them:

* ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)`` dequantizes
  every tensor (Q4_1 blocks, Q8_0 embedding) to float32; the output head is tied
  to the dequantized Q8_0 ``token_embd`` matrix. The whole forward pass is float32
  with eager PyTorch ops, so it is the "exact dequantized weights" reference;
  llama.cpp differs slightly because it quantizes activations to Q8 for its
  quantized matmuls.
* Prompts are rendered with the GGUF's own chat template
  (``apply_chat_template(messages, add_generation_prompt=True, tokenize=False)``)
  and tokenized with ``add_special_tokens=False``; ``<|im_start|>`` and
  ``<|im_end|>`` in the text are parsed as the special tokens 1 and 2.
  SmolLM2 adds no BOS, so the ids are exactly those of the text.
* Logits come from one plain forward pass over the prompt (no generation
  processors). The greedy continuation uses ``generate(do_sample=False,
  max_new_tokens=32, min_new_tokens=32)`` with every other processor switched
  off explicitly (no repetition penalty, temperature/top-k/top-p unset); the
  only processor left is MinNewTokens, which sets the EOS logit (id 2) to -inf
  for all 32 steps, so the continuation is argmax over the other tokens.

Q/K permutation: llama.cpp's converter permutes the rows of ``attn_q`` and
``attn_k`` per head (HF's rotate-half RoPE layout to llama.cpp's interleaved
pairs layout). When transformers loads a GGUF of arch ``llama`` its
``LlamaTensorProcessor`` undoes this: for each head it reshapes the rows to
``(n_head, 2, head_dim/2)`` view as ``(n_head, head_dim/2, 2)`` and swaps the
two inner axes (``_reverse_permute_weights``; for ``attn_k`` with n_head =
n_kv_heads = 3, for ``attn_q`` with 9 heads), then runs its usual rotate-half
(NeoX-style) RoPE. So HF's Q/K weights are in the original HF order, and
llama.cpp's GGUF weights with llama.cpp's interleaved ("normal") RoPE give the
same attention.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path

import numpy as np
from model_cache import cached_model

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
N_NEW = 32
TOP_K = 20


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", default=str(FIXTURES / "chat_prompts.json"))
    ap.add_argument("--out-json", default=str(FIXTURES / "hf_reference.json"))
    ap.add_argument("--out-npz", default=str(FIXTURES / "hf_logits.npz"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    args.model = args.model or cached_model()

    import gguf
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    model_path = os.path.abspath(args.model)
    name = os.path.basename(model_path)
    convs = json.loads(Path(args.prompts).read_text())

    with tempfile.TemporaryDirectory() as folder:
        os.symlink(model_path, os.path.join(folder, name))
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    cfg = model.config
    gen_cfg = model.generation_config
    assert model.dtype == torch.float32
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    eos_id = gen_cfg.eos_token_id
    eos_ids = sorted(set(eos_id if isinstance(eos_id, list) else [eos_id]))
    # The GGUF's generation config must not switch on any processor by itself
    # (checked again per prompt below: processed scores == raw logits except EOS).
    assert gen_cfg.repetition_penalty in (None, 1.0), gen_cfg.repetition_penalty
    assert not gen_cfg.do_sample, gen_cfg.do_sample

    rope = getattr(cfg, "rope_parameters", None) or {}
    config_info = {
        "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads),
        "rope_theta": rope.get("rope_theta", getattr(cfg, "rope_theta", None)),
        "rope_type": rope.get("rope_type"),
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "lm_head_shares_embedding_tensor": tied,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "generation_eos_token_ids": eos_ids,
    }

    records = []
    all_logits = np.zeros((len(convs), cfg.vocab_size), dtype=np.float32)
    for i, conv in enumerate(convs):
        messages = conv["messages"]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False).input_ids
        assert tok.decode(ids) == text, i
        inp = torch.tensor([ids], dtype=torch.long)
        with torch.no_grad():
            logits = model(input_ids=inp, use_cache=False).logits[0, -1].float().numpy()
            out = model.generate(
                inp,
                attention_mask=torch.ones_like(inp),
                do_sample=False,
                num_beams=1,
                max_new_tokens=N_NEW,
                min_new_tokens=N_NEW,
                repetition_penalty=None,
                no_repeat_ngram_size=None,
                temperature=None,
                top_k=None,
                top_p=None,
                min_p=None,
                typical_p=None,
                epsilon_cutoff=None,
                eta_cutoff=None,
                bad_words_ids=None,
                suppress_tokens=None,
                begin_suppress_tokens=None,
                renormalize_logits=False,
                pad_token_id=eos_ids[0],
                eos_token_id=eos_ids,
                output_logits=True,
                output_scores=True,
                return_dict_in_generate=True,
            )
        # No processor other than MinNewTokens (EOS -> -inf) changed any score.
        for raw, proc in zip(out.logits, out.scores):
            raw = raw[0].clone()
            raw[eos_ids] = -float("inf")
            assert torch.equal(raw, proc[0]), i
        greedy = out.sequences[0, len(ids) :].tolist()
        assert len(greedy) == N_NEW
        assert not set(greedy) & set(eos_ids)
        # First generated token must be the argmax of the plain forward pass (EOS masked).
        masked = logits.copy()
        masked[eos_ids] = -np.inf
        assert greedy[0] == int(np.argmax(masked)), (i, greedy[0], int(np.argmax(masked)))
        all_logits[i] = logits
        top = np.argsort(-logits, kind="stable")[:TOP_K]
        records.append(
            {
                "index": i,
                "messages": messages,
                "prompt_text": text,
                "prompt_ids": ids,
                "n_prompt_tokens": len(ids),
                "top1_id": int(top[0]),
                "top20_ids": [int(t) for t in top],
                "top20_logits": [float(logits[t]) for t in top],
                "greedy_ids": greedy,
                "greedy_text": tok.decode(greedy, skip_special_tokens=False),
            }
        )
        print(f"{i:2d} n={len(ids):3d} top1={int(top[0]):5d} {records[-1]['greedy_text'][:60]!r}")

    result = {
        "description": "SmolLM2-135M-Instruct Q4_1 reference from HF transformers (float32 dequantized); "
        "see scripts/make_hf_reference.py",
        "model": name,  # the file name only: no machine path in a committed fixture
        "model_sha256": sha256(model_path),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf"),
            "numpy": np.__version__,
        },
        "config": config_info,
        "hf_reverses_llamacpp_qk_permutation": True,
        "tokenize": "apply_chat_template(add_generation_prompt=True, tokenize=False) then "
        "tokenizer(text, add_special_tokens=False); no BOS",
        "greedy": {
            "max_new_tokens": N_NEW,
            "min_new_tokens": N_NEW,
            "eos_masked_ids": eos_ids,
            "processors": "MinNewTokens only (EOS -> -inf)",
        },
        "top_k": TOP_K,
        "prompts": records,
    }
    Path(args.out_json).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    np.savez_compressed(args.out_npz, logits=all_logits)
    print("wrote", args.out_json, "and", args.out_npz)


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
