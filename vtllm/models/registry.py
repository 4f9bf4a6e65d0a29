"""Architectures this engine runs, by the names GGUF and HF configs give them."""

import msgspec

from vtllm.errors import UnsupportedModel


class Family(msgspec.Struct, frozen=True):
    name: str
    qkv_bias: bool = False
    qk_norm: bool = False
    # llama.cpp's converter permutes Q/K rows of these GGUF architectures for its rope layout
    gguf_qk_permuted: bool = False


_FAMILIES = {
    "llama": Family("llama", gguf_qk_permuted=True),
    "mistral": Family("mistral", gguf_qk_permuted=True),
    "qwen2": Family("qwen2", qkv_bias=True),
    "qwen3": Family("qwen3", qk_norm=True),
}

# HF `architectures[0]` -> family name
_HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


def family(name: str) -> Family:
    try:
        return _FAMILIES[name]
    except KeyError:
        supported = ", ".join(sorted(_FAMILIES))
        raise UnsupportedModel(
            f"unsupported architecture {name!r} (supported: {supported})"
        ) from None


def family_for_hf(architectures: list[str]) -> Family:
    for arch in architectures:
        if arch in _HF_ARCHITECTURES:
            return _FAMILIES[_HF_ARCHITECTURES[arch]]
    supported = ", ".join(sorted(_HF_ARCHITECTURES))
    raise UnsupportedModel(f"unsupported architecture {architectures} (supported: {supported})")


def model_class(architecture: str):
    """The forward of an architecture's family (models/<family>.py): every family here is
    the Llama one's."""
    family(architecture)
    from vtllm.models.llama import LlamaModel

    return LlamaModel
