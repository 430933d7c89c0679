"""`miro models inspect`: what a GGUF file holds and whether miro runs it, read from its metadata alone.

Every figure comes from the header (tensor names, types, shapes, metadata); no weight is read. Whether miro
runs the file is the same check the engine makes before loading (models.check_model_file), so the sentence
that refuses a file here is the sentence `miro run` would print.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from gguf import Keys

from miro.core.errors import MiroError
from miro.core.loading.gguf_file import GGUFFile
from miro.core.models import check_model_file
from miro.core.models.mixture import active_parameters
from miro.core.loading.weight_format import choose_for_file


@dataclass
class ModelInfo:
    path: str
    architecture: str
    name: str | None
    parameters: int  # elements of every tensor (a tied head counted once)
    file_bytes: int
    tensor_types: dict[str, float] = field(default_factory=dict)  # type name -> share of the tensors' bytes
    context_length: int | None = None
    rope_scaling: str | None = None  # "none", "linear x4", "yarn x4 (from 32,768)", with "+ frequency factors"
    chat_template: bool = False
    runs: bool = False
    weights: str | None = None  # the format `weights="auto"` takes on this CPU, and why
    refusal: str | None = None  # the one sentence why miro does not run it
    experts: int = 0  # a mixture of experts: experts per layer (0: dense)
    experts_active: int = 0  # experts each token runs through
    shared_expert_width: int = 0  # an always-on shared expert's width (0: none)
    active_parameters: int | None = None  # parameters a token runs through (a mixture: less the unused experts)

    def as_dict(self) -> dict:
        return asdict(self)


def inspect_model(path: str | Path) -> ModelInfo:
    """The file's facts and miro's verdict; a file that is not a readable GGUF raises ModelFileError."""
    gguf = GGUFFile(path)
    arch = gguf.get(Keys.General.ARCHITECTURE)
    tensors = list(gguf.tensors.values())
    type_bytes: dict[str, int] = {}
    for t in tensors:
        type_bytes[t.type.name] = type_bytes.get(t.type.name, 0) + t.data.nbytes
    total = sum(type_bytes.values()) or 1
    info = ModelInfo(
        path=str(path),
        architecture=str(arch),
        name=gguf.get(Keys.General.NAME),
        parameters=sum(int(np.prod(t.shape)) for t in tensors),
        file_bytes=Path(path).stat().st_size,
        tensor_types={name: round(n / total, 4) for name, n in sorted(type_bytes.items(), key=lambda kv: -kv[1])},
        context_length=gguf.get(Keys.LLM.CONTEXT_LENGTH.format(arch=arch)),
        chat_template=Keys.Tokenizer.CHAT_TEMPLATE in gguf.metadata,
    )
    try:
        config = check_model_file(gguf)
    except MiroError as err:
        info.refusal = str(err)
        return info
    info.runs = True
    if config.n_expert:
        info.experts, info.experts_active = config.n_expert, config.n_expert_used
        info.shared_expert_width = config.shared_ffn_dim
        info.active_parameters = active_parameters(config, info.parameters)
    info.context_length = config.context_length
    scaling = "none" if config.rope_scaling == "none" else f"{config.rope_scaling} x{config.rope_factor:g}"
    if config.rope_scaling == "yarn":
        scaling += f" (from {config.rope_orig_context:,})"
    if "rope_freqs.weight" in gguf.tensors:
        scaling += " + frequency factors"
    if "rope_factors_long.weight" in gguf.tensors:  # phi3's longrope: chosen by the context miro runs with
        original = config.rope_orig_context or config.context_length
        scaling += f" + longrope factors (the long ones where max_model_len exceeds {original:,})"
    info.rope_scaling = scaling if config.causal else None
    choice = choose_for_file(gguf, "auto", None, encoder=not config.causal)
    info.weights = choice.why
    return info


def describe(info: ModelInfo) -> list[str]:
    """The report as lines for a terminal."""
    lines = [
        f"{info.path}",
        f"  architecture   {info.architecture}" + (f" ({info.name})" if info.name else ""),
        f"  parameters     {info.parameters:,} ({info.file_bytes / 2**20:,.1f} MiB on disk)",
        "  tensor types   " + ", ".join(f"{name} {share:.1%}" for name, share in info.tensor_types.items()),
    ]
    if info.context_length is not None:
        lines.append(
            f"  context        {info.context_length:,} tokens"
            + (f", RoPE scaling {info.rope_scaling}" if info.rope_scaling else "")
        )
    if info.experts:
        shared = f", plus a shared expert {info.shared_expert_width} wide" if info.shared_expert_width else ""
        lines.append(
            f"  experts        {info.experts} a layer, {info.experts_active} active per token{shared}; "
            f"{info.active_parameters:,} parameters active"
        )
    lines.append(f"  chat template  {'yes' if info.chat_template else 'no'}")
    lines.append(f"  miro runs it   {'yes, ' + info.weights if info.runs else 'no: ' + info.refusal}")
    return lines
