"""A sentence-transformers BERT (a folder or zip of model.safetensors, tokenizer.json and its configs) written
once as a GGUF in llama.cpp's own BERT layout, so miro has one loader and llama.cpp reads the same file.

What convert_hf_to_gguf.py's BertModel writes, and so what this writes:
- `general.architecture = "bert"`, the `bert.*` sizes, `bert.attention.causal = false` and
  `bert.pooling_type` (1 mean, 2 cls) from `1_Pooling/config.json`;
- the WordPiece vocabulary as `tokenizer.ggml.model = "bert"` in llama.cpp's "phantom space" form: a
  word-start piece "foo" becomes "\u2581foo", a continuation "##bar" becomes "bar", special tokens stay;
- the tensors renamed (token_embd, token_types, position_embd, token_embd_norm, blk.N.attn_q/k/v,
  attn_output, attn_output_norm, ffn_up, ffn_down, layer_output_norm), in float32 as stored.

safetensors is read with numpy alone: an 8-byte header length, a JSON header, then the raw tensors.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import numpy as np

from miro.core.errors import ModelFileError

PHANTOM_SPACE = "\u2581"
_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
_POOLING = {"pooling_mode_mean_tokens": 1, "pooling_mode_cls_token": 2}
_BLOCK_TENSORS = {  # HF name inside encoder.layer.N -> llama.cpp's name inside blk.N
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
_EMBEDDING_TENSORS = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.LayerNorm": "token_embd_norm",
}
_UNUSED = ("embeddings.position_ids", "pooler.")  # the pooler is BERT's classifier head, not the embedding


class _Source:
    """The files of a sentence-transformers model, from a folder or a zip of one."""

    def __init__(self, path: Path):
        self.path = path
        self._zip = zipfile.ZipFile(path) if path.is_file() else None

    def read(self, name: str) -> bytes:
        try:
            if self._zip is not None:
                return self._zip.read(name)
            return (self.path / name).read_bytes()
        except (KeyError, FileNotFoundError):
            raise ModelFileError(f"{self.path} has no {name}: it is not a sentence-transformers BERT model.") from None

    def has(self, name: str) -> bool:
        return name in self._zip.namelist() if self._zip is not None else (self.path / name).is_file()

    def json(self, name: str) -> dict:
        return json.loads(self.read(name))


def read_safetensors(data: bytes) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file, as float32 arrays (F32, F16 and BF16; other types are skipped)."""
    (header_len,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8 : 8 + header_len])
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] not in _SAFETENSORS_DTYPES:
            continue
        begin, end = info["data_offsets"]
        raw = np.frombuffer(
            data,
            _SAFETENSORS_DTYPES[info["dtype"]],
            (end - begin) // np.dtype(_SAFETENSORS_DTYPES[info["dtype"]]).itemsize,
            base + begin,
        )
        if info["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = raw.astype(np.float32).reshape(info["shape"])
    return tensors


def gguf_tensor_name(hf_name: str) -> str | None:
    """llama.cpp's name for a HF BERT tensor ("encoder.layer.3.output.dense.bias" -> "blk.3.ffn_down.bias"),
    None for one the embedding does not use. ModelFileError for one this layout does not know."""
    name = hf_name.removeprefix("bert.")
    if name.startswith(_UNUSED):
        return None
    stem, _, kind = name.rpartition(".")
    kind = {"gamma": "weight", "beta": "bias"}.get(kind, kind)
    if stem in _EMBEDDING_TENSORS:
        return f"{_EMBEDDING_TENSORS[stem]}.{kind}"
    parts = stem.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["encoder", "layer"] and parts[2].isdigit() and parts[3] in _BLOCK_TENSORS:
        return f"blk.{int(parts[2])}.{_BLOCK_TENSORS[parts[3]]}.{kind}"
    raise ModelFileError(f"tensor {hf_name!r} is not part of a BERT encoder miro can convert.")


def phantom_vocabulary(vocab: dict[str, int], special: set[str]) -> tuple[list[str], list[int]]:
    """tokenizer.json's WordPiece vocabulary in llama.cpp's form: the tokens by id and their GGUF token types
    (3 control for special tokens, 1 normal for the rest)."""
    tokens = [""] * len(vocab)
    for token, token_id in vocab.items():
        tokens[token_id] = token
    if any(t == "" for t in tokens):
        raise ModelFileError("tokenizer.json's vocabulary does not number its tokens 0..n-1.")
    types = [3 if t in special else 1 for t in tokens]
    phantom = [t if t in special else t[2:] if t.startswith("##") else PHANTOM_SPACE + t for t in tokens]
    return phantom, types


def convert_sentence_transformers(source_path: str | Path, out_path: str | Path, name: str = "") -> Path:
    """Write the model at source_path (a folder or a .zip) as a BERT GGUF at out_path; returns out_path."""
    import gguf

    source = _Source(Path(source_path))
    config = source.json("config.json")
    if config.get("model_type") != "bert":
        raise ModelFileError(f"{source_path}: model_type is {config.get('model_type')!r}; only BERT converts.")
    if config.get("hidden_act", "gelu") != "gelu" or config.get("position_embedding_type", "absolute") != "absolute":
        raise ModelFileError(f"{source_path}: only BERT with GELU and absolute positions converts.")
    tokenizer = source.json("tokenizer.json")
    if tokenizer.get("model", {}).get("type") != "WordPiece":
        raise ModelFileError(f"{source_path}: tokenizer.json is not a WordPiece tokenizer.")
    pooling = source.json("1_Pooling/config.json") if source.has("1_Pooling/config.json") else {}
    pooling_type = next((code for key, code in _POOLING.items() if pooling.get(key)), 1)
    special = {t["content"] for t in tokenizer.get("added_tokens", []) if t.get("special")}
    tokens, token_types = phantom_vocabulary(tokenizer["model"]["vocab"], special)
    token_id = {t: i for i, t in enumerate(tokens)}
    normalizer = tokenizer.get("normalizer") or {}
    if normalizer.get("type") == "BertNormalizer" and normalizer.get("lowercase") is False:
        raise ModelFileError(f"{source_path}: a cased BERT vocabulary is not supported (llama.cpp lower-cases).")

    writer = gguf.GGUFWriter(str(out_path), "bert")
    writer.add_name(name or config.get("_name_or_path", "bert"))
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config.get("layer_norm_eps", 1e-12))
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(pooling_type))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_type_count(config.get("type_vocab_size", 2))
    for key, token in (("bos", "[CLS]"), ("sep", "[SEP]"), ("unk", "[UNK]"), ("pad", "[PAD]"), ("mask", "[MASK]")):
        if token in token_id:
            getattr(writer, f"add_{key}_token_id")(token_id[token])
    for hf_name, tensor in read_safetensors(source.read("model.safetensors")).items():
        gguf_name = gguf_tensor_name(hf_name)
        if gguf_name is not None:
            writer.add_tensor(gguf_name, np.ascontiguousarray(tensor))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(out_path)
