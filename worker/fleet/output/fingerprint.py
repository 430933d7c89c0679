"""What makes a result row reusable: the request's hash over everything that decides its output.

A deterministic request (greedy, or seeded; every embedding) has exactly one answer per model file and engine
settings, because miro's outputs are batch-invariant: a request's tokens never depend on what runs beside it. So a
row is keyed by `request_hash`, the sha256 of canonical JSON holding
- the request's fields that shape its rows (kind, prompt or messages, sampling options with their defaults
  filled in, embedding inputs and pooling options, a Responses request's echo), not its custom id, line or own
  fields, which a rerun may change freely;
- the model file's sha256 (`model_sha256`, computed once per file and cached by path, size and mtime);
- the engine settings that change outputs (`settings`: the weight format as loaded, the KV cache's dtype, the
  context length, batch invariance);
- OUTPUT_VERSION, which a change to miro that changes any output bumps, so nothing earlier is reused after it.
Workers write `request_hash` and `model_sha256` in every successful row; `--reuse` (intake/reuse.py) computes the
same hash for each request of a new dataset before anything loads (`expected_stamp`) and takes an earlier row with
that hash instead of running the request.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from miro.core.errors import MiroError

# Bump whenever a change makes any request's output rows differ (kernels, sampling, tokenizer, chat templates, row
# building): rows written before then are never reused after it.
OUTPUT_VERSION = 1


def canonical_request(request) -> dict:
    """The fields of a Request (or JobPayload) that shape its result rows, as plain JSON values."""
    return {
        "kind": request.kind,
        "prompt": request.prompt,
        "messages": request.messages,
        "sampling": request.sampling or {},
        "inputs": request.inputs,
        "pooling": request.pooling,
        "encoding_format": request.encoding_format,
        "response": asdict(request.response) if request.response is not None else None,
    }


def deterministic(request) -> bool:
    """One answer per model and settings: an embedding, or a generation that is greedy (temperature 0, top_k 1:
    params.is_greedy) or seeded. Read from the request's sampling options, which intake validated as
    SamplingParams, and SamplingParams' defaults for those it does not give (making one per request would compile
    its structured output again)."""
    if request.kind == "embedding":
        return True
    from miro.core.sampling.params import SamplingParams, is_greedy

    sampling = request.sampling or {}
    greedy = is_greedy(
        sampling.get("temperature", SamplingParams.temperature), sampling.get("top_k", SamplingParams.top_k)
    )
    return greedy or sampling.get("seed") is not None


@dataclass(frozen=True)
class OutputStamp:
    """What besides the request decides its output: the model file and the engine's settings."""

    model_sha256: str
    settings: str  # "weights=native;kv_cache_dtype=float16;max_model_len=8192;batch_invariant=1"

    def request_hash(self, request) -> str:
        """The sha256 of the canonical JSON of {"version", "model_sha256", "settings", "request"} (sorted keys, no
        spaces): the stamp's part of that text is hashed once (`_hashed_prefix`), each request's from there."""
        digest = self._hashed_prefix.copy()
        digest.update(_canonical_json(canonical_request(request)).encode())
        digest.update(f'{self._settings_part},"version":{_canonical_json(OUTPUT_VERSION)}}}'.encode())
        return digest.hexdigest()

    @functools.cached_property
    def _hashed_prefix(self):
        """The document's text before the request (its keys sorted: model_sha256, request, settings, version)."""
        return hashlib.sha256(f'{{"model_sha256":{_canonical_json(self.model_sha256)},"request":'.encode())

    @functools.cached_property
    def _settings_part(self) -> str:
        """The document's text after the request, up to the version (read at each hash: a test may change it)."""
        return f',"settings":{_canonical_json(self.settings)}'

    @property
    def batch_invariant(self) -> bool:
        return self.settings.endswith("batch_invariant=1")


# json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False), without making an
# encoder per call (json.dumps does for any option given)
_canonical_json = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def settings_text(weights: str, kv_cache_dtype: str, max_model_len: int, batch_invariant: bool) -> str:
    return (
        f"weights={weights};kv_cache_dtype={kv_cache_dtype};max_model_len={max_model_len};"
        f"batch_invariant={int(bool(batch_invariant))}"
    )


def engine_stamp(engine, model: str) -> OutputStamp:
    """A loaded engine's stamp (the worker's): `model` its alias or path."""
    from miro.core.loading.registry import resolve_model

    settings = settings_text(
        engine.weight_format, engine.kv_cache_dtype, engine.max_model_len, engine.engine_config.batch_invariant
    )
    return OutputStamp(model_sha256(resolve_model(model)), settings)


def expected_stamp(model: str, engine_options: dict) -> OutputStamp:
    """The stamp an engine loaded from `model` with these options (Engine.from_model's keywords) on this machine
    will have, from the file's header alone: the rows it would write carry the hashes this gives."""
    from dataclasses import replace

    from miro.core.engine.engine_config import EngineConfig
    from miro.core.engine.kv_cache import check_kv_cache_dtype
    from miro.core.loading.gguf_file import GGUFFile
    from miro.core.loading.registry import resolve_model
    from miro.core.loading.weight_format import choose_for_file
    from miro.core.models import read_config

    config = EngineConfig.of(engine_options)
    path = resolve_model(model)
    gguf = GGUFFile(path)
    model_config = read_config(gguf)
    context = min(config.max_model_len or model_config.context_length, model_config.context_length)
    model_config = replace(model_config, n_ctx=context)
    choice = choose_for_file(gguf, config.weights, config.max_weight_memory, encoder=not model_config.causal)
    settings = settings_text(
        choice.format, check_kv_cache_dtype(config.kv_cache_dtype), context, config.batch_invariant
    )
    return OutputStamp(model_sha256(path), settings)


_memo: dict[tuple[str, int, int], str] = {}
_lock = threading.Lock()


def _cache_file() -> Path:
    from miro.core.loading.registry import miro_home

    return Path(miro_home()) / "model_sha256.json"


def model_sha256(path: str | os.PathLike) -> str:
    """The file's sha256, computed once per (path, size, mtime): remembered in this process and in
    $MIRO_HOME/model_sha256.json, so a rerun, or another worker on the machine, does not read the file again."""
    path = os.path.abspath(path)
    try:
        info = os.stat(path)
    except OSError as err:
        raise MiroError(f"Cannot read the model file {path} ({err.strerror or err}).") from None
    key = (path, info.st_size, info.st_mtime_ns)
    if key in _memo:
        return _memo[key]
    with _lock:
        cached = _read_cache()
        entry = cached.get(path)
        if entry and entry.get("size") == info.st_size and entry.get("mtime_ns") == info.st_mtime_ns:
            _memo[key] = entry["sha256"]
            return entry["sha256"]
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        _memo[key] = digest.hexdigest()
        cached[path] = {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "sha256": _memo[key]}
        _write_cache(cached)
        return _memo[key]


def _read_cache() -> dict:
    try:
        data = json.loads(_cache_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(cached: dict) -> None:
    """Under a temporary name, then renamed; a cache that cannot be written only costs a rehash next time."""
    target = _cache_file()
    temporary = target.with_name(f".{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps(cached, indent=0))
        os.replace(temporary, target)
    except OSError:
        temporary.unlink(missing_ok=True)
