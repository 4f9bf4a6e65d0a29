"""vtllm: an OpenAI-compatible LLM inference server with numba kernels."""

from vtllm.scheduler.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name):
    # LLM pulls in numba and the model code; import it only when asked for.
    if name == "LLM":
        from vtllm.llm import LLM

        return LLM
    raise AttributeError(name)
