"""lite-llm: CPU-only LLM inference and serving (paged KV cache, continuous batching,
OpenAI-compatible server) with Cython/OpenMP kernels and no PyTorch."""
__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]


def __getattr__(name):  # lazy: `import lite_llm` stays cheap for the CLI
    if name == "LLM":
        from lite_llm.llm import LLM
        return LLM
    if name == "SamplingParams":
        from lite_llm.sampling_params import SamplingParams
        return SamplingParams
    if name in ("RequestOutput", "CompletionOutput"):
        from lite_llm import outputs
        return getattr(outputs, name)
    raise AttributeError(name)
