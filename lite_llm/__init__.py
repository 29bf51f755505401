"""lite-llm: CPU-only LLM inference and serving (paged KV cache, continuous batching,
OpenAI-compatible server) with Cython/OpenMP kernels and no PyTorch."""
__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "GuidedDecodingParams", "RequestOutput", "CompletionOutput", "LoRARequest",
           "BeamSearchParams", "__version__"]


def __getattr__(name):  # lazy: `import lite_llm` stays cheap for the CLI
    if name == "LLM":
        from lite_llm.llm import LLM
        return LLM
    if name in ("SamplingParams", "StructuredOutputsParams", "GuidedDecodingParams"):
        from lite_llm import sampling_params
        return getattr(sampling_params, name)
    if name == "BeamSearchParams":
        from lite_llm.sampling_params import BeamSearchParams
        return BeamSearchParams
    if name == "LoRARequest":
        from lite_llm.lora import LoRARequest
        return LoRARequest
    if name in ("RequestOutput", "CompletionOutput"):
        from lite_llm import outputs
        return getattr(outputs, name)
    raise AttributeError(name)
