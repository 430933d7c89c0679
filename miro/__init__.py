"""miro: offline batch LLM inference on CPUs.

`from miro import LLM, SamplingParams` is vLLM's offline API (miro.core.llm); `Engine`, `EngineConfig` and
miro's errors are miro.core's. Every name is imported when first asked for, so `import miro.core` and the CLI
stay as light as they were (numba loads with the Engine, not before).
"""

from pkgutil import extend_path

# Run from a checkout whose miro/ is this folder, the subpackages (miro.core = core/, ...) are wherever miro is
# installed: look for them on all of sys.path, not only here.
__path__ = extend_path(__path__, __name__)

_FROM_LLM = (
    "LLM",
    "SamplingParams",
    "StructuredOutputsParams",
    "GuidedDecodingParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "EmbeddingRequestOutput",
    "EmbeddingOutput",
    "PoolingRequestOutput",
    "TextPrompt",
    "TokensPrompt",
    "LLMError",
)
_FROM_CORE = ("Engine", "EngineConfig", "MiroError", "ModelFileError", "RequestError")

__all__ = [*_FROM_LLM, *_FROM_CORE]


def __getattr__(name: str):
    if name in _FROM_LLM:
        from miro.core import llm

        return getattr(llm, name)
    if name in _FROM_CORE:
        import miro.core

        return getattr(miro.core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *__all__])
