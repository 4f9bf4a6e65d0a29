"""Architectures this engine runs, by the names GGUF and HF configs give them."""

import msgspec

from vtllm.errors import UnsupportedModel


class Family(msgspec.Struct, frozen=True):
    name: str
    qkv_bias: bool = False
    qk_norm: bool = False
    # llama.cpp's converter permutes Q/K rows of these GGUF architectures for its rope layout
    gguf_qk_permuted: bool = False
    forward: str = "llama"  # the family's model file, models/<forward>.py
    cuda: bool = True  # False: the CUDA backend lacks ops its forward needs
    gguf: bool = True  # False: its GGUF tensors and metadata are not read (nor written) yet
    gguf_arch: str = ""  # llama.cpp's name for it where that is not `name`


_FAMILIES = {
    "llama": Family("llama", gguf_qk_permuted=True),
    "mistral": Family("mistral", gguf_qk_permuted=True),
    "qwen2": Family("qwen2", qkv_bias=True),
    "qwen3": Family("qwen3", qk_norm=True),
    "gemma2": Family("gemma2", forward="gemma"),
    "gemma3": Family("gemma3", qk_norm=True, forward="gemma"),
    # the Llama forward; its own config and tensor names (models/phi3_checkpoint)
    "phi3": Family("phi3"),
    "qwen3_moe": Family("qwen3_moe", qk_norm=True, forward="moe", gguf_arch="qwen3moe"),
    # llama.cpp writes Mixtral as `llama` with experts (its Q/K rows permuted as llama's)
    "mixtral": Family("mixtral", gguf_qk_permuted=True, forward="moe", gguf_arch="llama"),
}

# HF `architectures[0]` -> family name
_HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # its text model alone
    "Phi3ForCausalLM": "phi3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
}


def lookup(name: str) -> Family:
    """The family of a registry name, whatever the checkpoint kind."""
    try:
        return _FAMILIES[name]
    except KeyError:
        supported = ", ".join(sorted(_FAMILIES))
        raise UnsupportedModel(
            f"unsupported architecture {name!r} (supported: {supported})"
        ) from None


def family(name: str, num_experts: int = 0) -> Family:
    """The family of a GGUF architecture name (the GGUF loader and writer's lookup), given
    the file's expert count (llama.cpp's `llama` with experts is Mixtral)."""
    if name == "llama" and num_experts:
        name = "mixtral"
    elif name not in _FAMILIES:  # llama.cpp's own name for one of ours (qwen3moe)
        name = next((f.name for f in _FAMILIES.values() if f.gguf_arch == name), name)
    fam = lookup(name)
    if not fam.gguf:
        raise UnsupportedModel(f"architecture {name!r} loads from HF safetensors only for now")
    if num_experts and fam.forward != "moe":
        raise UnsupportedModel(f"architecture {name!r} with {num_experts} experts is not supported")
    return fam


def family_for_hf(architectures: list[str]) -> Family:
    for arch in architectures:
        if arch in _HF_ARCHITECTURES:
            return _FAMILIES[_HF_ARCHITECTURES[arch]]
    supported = ", ".join(sorted(_HF_ARCHITECTURES))
    raise UnsupportedModel(f"unsupported architecture {architectures} (supported: {supported})")


def model_class(architecture: str):
    """The forward of an architecture's family (models/<family>.py)."""
    forward = lookup(architecture).forward
    if forward == "gemma":
        from vtllm.models.gemma import GemmaModel

        return GemmaModel
    if forward == "moe":
        from vtllm.models.moe import MoeModel

        return MoeModel
    from vtllm.models.llama import LlamaModel

    return LlamaModel


def gguf_architecture(fam: Family) -> str:
    """The GGUF architecture name llama.cpp gives the family (the GGUF writer's)."""
    return fam.gguf_arch or fam.name


def check_cuda(architecture: str) -> None:
    """Raises UnsupportedModel for a family whose ops the CUDA backend does not have yet."""
    if not lookup(architecture).cuda:
        raise UnsupportedModel(
            f"architecture {architecture!r} runs on the CPU backend only for now "
            "(the CUDA backend lacks its ops); use the CPU device"
        )
