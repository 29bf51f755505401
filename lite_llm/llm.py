"""The offline API (vLLM's `LLM`): its arguments become EngineArgs, and the engine is built by
the one assembly function (engine/assemble.py), as the server's is.
"""
from __future__ import annotations

import logging
import os
import sys
import uuid
from typing import Any

from lite_llm import multimodal
from lite_llm.engine import beam_search
from lite_llm.engine.beam_search import BeamSearchOutput
from lite_llm.sampling_params import BeamSearchParams
from lite_llm.engine.args import EngineArgs
from lite_llm.engine import pooling
from lite_llm.engine.assemble import (Assembled, KVPlan, build_async_engine, build_engine, default_max_num_seqs,
                                      plan_kv_cache, plan_ranks)
from lite_llm.model.pooler import runner_for_model
from lite_llm.outputs import RequestOutput, fold
from lite_llm.sampling_params import RequestOutputKind, SamplingParams

log = logging.getLogger("lite_llm")

# the assembly's names, where the CLI programs and the tests have always found them
__all__ = ["LLM", "EngineArgs", "Assembled", "KVPlan", "build_engine", "build_async_engine", "plan_kv_cache",
           "plan_ranks", "default_max_num_seqs", "default_sampling_params"]

def default_sampling_params(generation_config: dict) -> SamplingParams:
    """SamplingParams with the model's generation_config.json defaults, as vLLM applies them."""
    fields = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
              "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
    kwargs = {ours: generation_config[theirs] for theirs, ours in fields.items()
              if generation_config.get(theirs) is not None}
    return SamplingParams(**kwargs)


def _hub_model(model: str | None, revision: str | None, mmproj: str | None) -> tuple[str | None, str | None]:
    """(model, mmproj) with a Hugging Face name (org/name, org/name:QUANT) at `revision` (branch,
    tag or commit; main when None) turned into the cached files (fetched when missing), the
    mmproj beside a GGUF unless one is given; a local path as it is."""
    from lite_llm.model import hub
    if model is None or os.path.exists(os.path.expanduser(model)) or hub.parse_name(model) is None:
        if revision is not None:
            raise ValueError(f"revision={revision!r} is for a model named on the Hugging Face Hub, "
                             f"not {'the default model' if model is None else 'a local path'}")
        return model, mmproj
    found = hub.resolve(model, revision)
    return found.path, mmproj or found.mmproj


class LLM:
    """Offline batched generation, vLLM-compatible:

        llm = LLM("path/to/model")                       # or a .gguf file; None: SmolLM2-135M
        llm = LLM("Qwen/Qwen3-0.6B", revision="main")      # a Hugging Face name (org/name[:QUANT])
        outs = llm.generate(["Hello"], SamplingParams(max_tokens=32))
        outs[0].outputs[0].text
    """

    def __init__(self, model: str | None = None, dtype: str = "auto", max_model_len: int | None = None,
                 seed: int = 0, block_size: int = 128, kv_cache_space: float | None = None,
                 enable_prefix_caching: bool = True, max_num_seqs: int | None = None,
                 max_num_batched_tokens: int | None = None, skip_tokenizer_init: bool = False,
                 disable_sliding_window: bool = False, tokenizer: str | None = None,
                 quantization: str | None = None, kv_cache_dtype: str = "auto",
                 speculative_config: dict | str | None = None, tensor_parallel_size: int = 1,
                 runner: str = "auto", pooler_config: dict | str | None = None,
                 hf_overrides: dict | str | None = None, enable_lora: bool = False, max_loras: int = 1,
                 max_lora_rank: int = 16, deterministic: bool = False, **kwargs: Any):
        self._media = multimodal.media_config(kwargs.pop("limit_mm_per_prompt", None),   # image inputs
                                              kwargs.pop("mm_processor_kwargs", None),
                                              kwargs.pop("allowed_media_domains", None))
        mmproj = kwargs.pop("mmproj", None)     # llama.cpp's image encoder file beside a GGUF model
        model, mmproj = _hub_model(model, kwargs.pop("revision", None), mmproj)
        if kwargs:
            log.warning("LLM: ignoring unsupported arguments %s", sorted(kwargs))
        self._pooling = self._whisper = None
        if runner in ("auto", "transcription") and self._init_whisper(model, dtype, quantization):
            return
        # runner="pooling": embeddings, classification, scores
        self.runner_type = runner_for_model(model, runner, hf_overrides)
        if self.runner_type == "pooling":
            self.engine_args = EngineArgs(
                model, dtype=dtype, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens, seed=seed, quantization=quantization,
                tensor_parallel_size=tensor_parallel_size, runner="pooling", pooler_config=pooler_config,
                hf_overrides=hf_overrides, deterministic=deterministic)
            built = build_engine(self.engine_args)
            self._engine, self._loaded, self.info = built.engine, built.loaded, built.info.as_dict()
            self._pooling = pooling.PoolingClient(built.engine, built.tokenizer, built.pooling,
                                                  model or os.path.basename(built.loaded.source))
            self.tokenizer, self.config = self._loaded.tokenizer, self._loaded.config
            return
        self.engine_args = EngineArgs(
            model, dtype=dtype, max_model_len=max_model_len, block_size=block_size,
            kv_cache_space=kv_cache_space, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=enable_prefix_caching,
            seed=seed, disable_sliding_window=disable_sliding_window,
            skip_tokenizer_init=skip_tokenizer_init, serving=False, quantization=quantization,
            kv_cache_dtype=kv_cache_dtype, speculative_config=speculative_config,
            tensor_parallel_size=tensor_parallel_size, enable_lora=enable_lora, max_loras=max_loras,
            max_lora_rank=max_lora_rank, mmproj=mmproj, deterministic=deterministic)
        built = build_engine(self.engine_args)
        self._engine, self._loaded, self.info = built.engine, built.loaded, built.info.as_dict()
        self.tokenizer = self._loaded.tokenizer
        self.config = self._loaded.config
        self._mm_processor = multimodal.Processor.for_model(self._loaded.source, self._loaded.mmproj)

    # ---- public API -------------------------------------------------------------------

    def get_tokenizer(self):
        return self.tokenizer

    @property
    def llm_engine(self):
        """The LLMEngine behind this LLM (vLLM's name)."""
        return self._engine.engine if self._engine is not None else None

    def get_default_sampling_params(self) -> SamplingParams:
        return default_sampling_params(self._loaded.generation_config)

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True, lora_request=None) -> list[RequestOutput]:
        """prompts: a str, a {"prompt_token_ids": [...]} dict, or a list of either. Runs them
        batched; returns one RequestOutput per prompt, in order. lora_request: a LoRARequest
        (or None: the base model) for every prompt, or a list of them, one per prompt."""
        self._need("generate")
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        # folded below: the engine needs to hand each request over only once, finished
        final = {id(sp): sp.replace(output_kind=RequestOutputKind.FINAL_ONLY) for sp in params}
        params = [final[id(sp)] for sp in params]
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError(f"{len(loras)} LoRA requests for {len(prompts)} prompts")
        requests = [self._to_request(p) + (self._images(p),) for p in prompts]
        inputs = []
        for text, ids, images in requests:
            mm = None
            if images is not None:   # vLLM's {"prompt", "multi_modal_data": {"image": PIL or [PIL]}}
                ids, mm = self._mm_processor.process(ids, images, self._media)
            inputs.append((text, ids, mm))
        owner = f"generate-{uuid.uuid4().hex}"    # one caller: its prompts take slots FCFS between them
        with self._engine.submitting():           # all of them reach the engine's next step together
            streams = [self._engine.add_request(f"offline-{uuid.uuid4().hex}", ids, sp, prompt=text,
                                                lora_request=lora, mm=mm, owner=owner)
                       for (text, ids, mm), sp, lora in zip(inputs, params, loras)]
        results = []
        show = use_tqdm and sys.stderr.isatty()
        for i, stream in enumerate(streams):
            results.append(fold(stream))
            if show:
                sys.stderr.write(f"\rgenerate: {i + 1}/{len(streams)} requests done")
        if show:
            sys.stderr.write("\n")
        return results

    def beam_search(self, prompts, params: BeamSearchParams, lora_request=None,
                    use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """vLLM's LLM.beam_search: prompts (str or {"prompt"} / {"prompt_token_ids"} dicts, or
        a list of them) -> one BeamSearchOutput per prompt, its beam_width best sequences best
        first (lite_llm/engine/beam_search.py says how they are chosen and scored)."""
        self._need("generate")
        if isinstance(lora_request, list):
            raise ValueError("beam_search takes one LoRARequest for every prompt, not a list")
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if any(isinstance(p, dict) and p.get("multi_modal_data") for p in prompts):
            raise ValueError("beam_search does not take images (multi_modal_data)")
        ids = [self._to_request(p)[1] for p in prompts]
        owner = f"beam-{uuid.uuid4().hex}"     # one caller: its beams share slots fairly with others
        step = beam_search.engine_step(self._engine, owner, lora_request=lora_request)
        found = beam_search.search(step, ids, params,
                                   self._engine.engine.config.eos_token_ids, self._engine.engine.max_model_len)
        return beam_search.to_outputs(found, ids, self.tokenizer)

    def chat(self, messages, sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = True, chat_template: str | None = None,
             add_generation_prompt: bool = True) -> list[RequestOutput]:
        """messages: one conversation (list of {"role", "content"}) or a list of them."""
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer (skip_tokenizer_init=True was given)")
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = []
        for conv in conversations:
            conv, images = multimodal.flatten_chat(conv, self._mm_processor, self._media)   # image parts -> placeholders
            text = self.tokenizer.apply_chat_template(conv, add_generation_prompt=add_generation_prompt,
                                                      chat_template=chat_template)
            # the template already holds BOS and special tokens: don't add them twice
            prompts.append({"prompt": text,
                            "prompt_token_ids": self.tokenizer.encode(text, add_special_tokens=False)})
            if images:
                prompts[-1]["multi_modal_data"] = {"image": images}
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def embed(self, prompts, *, dimensions: int | None = None, normalize: bool | None = None,
              truncate_prompt_tokens: int | None = None, use_tqdm: bool = True):
        """One PoolingRequestOutput per prompt, .outputs.embedding (vLLM's LLM.embed)."""
        return pooling.embed(self._need("pooling"), prompts, dimensions=dimensions,
                             normalize=normalize, truncate_prompt_tokens=truncate_prompt_tokens)

    def classify(self, prompts, *, truncate_prompt_tokens: int | None = None, use_tqdm: bool = True):
        """One PoolingRequestOutput per prompt, .outputs.probs (a classifier head's)."""
        return pooling.classify(self._need("pooling"), prompts,
                                truncate_prompt_tokens=truncate_prompt_tokens)

    def score(self, text_1, text_2, *, truncate_prompt_tokens: int | None = None, use_tqdm: bool = True):
        """text_1 against each of text_2: one PoolingRequestOutput per pair, .outputs.score."""
        return pooling.score(self._need("pooling"), text_1, text_2,
                             truncate_prompt_tokens=truncate_prompt_tokens)

    def transcribe(self, audio, language: str | None = None, task: str = "transcribe", *,
                   prompt: str | None = None, temperature: float | tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
                   timestamps: bool | None = None, max_new_tokens: int | None = None, seed: int | None = 0,
                   beam_size: int | None = None, word_timestamps: bool = False, use_tqdm: bool = True):
        """Speech to text with a Whisper model: audio is a file path, encoded bytes (WAV, FLAC,
        MP3, OGG, WebM, M4A) or float32 samples at 16 kHz; language a code or name (None:
        detected); task "transcribe" or "translate" (to English); beam_size: beam search at
        temperature 0 (openai-whisper uses 5), None: greedy; word_timestamps: each segment's
        .words (word, start, end) too. Returns a Transcription (.text, .language, .segments with
        start / end in seconds). A progress bar on a terminal
        for audio longer than one 30-s window."""
        from lite_llm.multimodal import transcribe as tr
        if self._whisper is None:
            raise ValueError(f"this model runs the {self.runner_type!r} runner: it cannot transcribe "
                             "(LLM(model=<a Whisper checkpoint>))")
        samples = tr.load_audio(audio)
        opts = tr.TranscribeOptions(language=language, task=task, timestamps=timestamps, temperature=temperature,
                                    prompt=prompt, max_new_tokens=max_new_tokens, seed=seed, beam_size=beam_size,
                                    word_timestamps=word_timestamps)
        total = samples.shape[0] / tr.audio.SAMPLE_RATE
        show = use_tqdm and sys.stderr.isatty() and total > tr.audio.CHUNK_SECONDS
        result = None
        for result in self._whisper.transcribe_iter(samples, opts):
            if show:
                done = min(result.segments[-1].end if result.segments else 0.0, total)
                sys.stderr.write(f"\rtranscribe: {tr.progress_bar(done, total)}")
        if show:
            sys.stderr.write("\n")
        return result

    def _init_whisper(self, model, dtype: str, quantization: str | None = None) -> bool:
        """Load model as a Whisper checkpoint (the "transcription" runner) if it is one
        (quantization: an HF checkpoint's matrices quantized at load, WhisperModel.from_pretrained)."""
        from lite_llm.model.loader import resolve_model
        from lite_llm.multimodal import transcribe as tr
        if model is None:
            return False
        path = resolve_model(model)
        if not tr.is_whisper_model(path):       # an HF Whisper directory or a whisper.cpp model file
            return False
        self.runner_type, self._engine = "transcription", None
        self._whisper = tr.WhisperModel.from_pretrained(path, dtype="bfloat16" if dtype == "bfloat16" else "float32",
                                                        quantization=quantization)
        self.tokenizer, self.config, self.info = self._whisper.tokenizer, None, {"model": path}
        return True

    @property
    def pooling_client(self):
        """A pooling model's client (engine/pooling.py PoolingClient: its spec and PoolerConfig,
        pool() of token ids with token types), None for a model that generates."""
        return self._pooling

    def stats(self):
        """The engine's latest statistics (engine/stats.py EngineStats: token and request counts,
        preemptions, prefix-cache and speculative-decoding counters, the live window's rates)."""
        if self._engine is None:
            raise ValueError("this model runs no engine (a Whisper model's transcriptions run beside it)")
        return self._engine.stats()

    def _need(self, runner: str):
        """The pooling calls of this model's engine (runner "pooling"), or a ValueError naming
        this model's runner."""
        if self.runner_type != runner:
            what = "generate text" if runner == "generate" else "embed, classify or score"
            raise ValueError(f"this model runs the {self.runner_type!r} runner: it cannot {what} "
                             f"(LLM(model, runner={runner!r}) for a model that supports it)")
        return self._pooling

    def shutdown(self) -> None:
        if self._whisper is not None:
            return
        self._engine.shutdown(0.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    # ---- helpers ----------------------------------------------------------------------

    def _images(self, prompt) -> list | None:
        """The PIL images of a prompt dict's multi_modal_data (None: a text prompt)."""
        data = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
        if not data:
            return None
        if self._mm_processor is None:
            raise multimodal.MediaError(f"{self._loaded.source} does not take images")
        if set(data) != {"image"}:
            raise multimodal.MediaError(f"multi_modal_data takes \"image\" only, not {sorted(set(data) - {'image'})}")
        images = data["image"] if isinstance(data["image"], (list, tuple)) else [data["image"]]
        return [multimodal.check_image(im, f"image {k}", self._media) for k, im in enumerate(images)]

    def _to_request(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; pass {'prompt_token_ids': [...]}")
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
        if isinstance(prompt, dict) and "prompt" in prompt:
            return self._to_request(prompt["prompt"])
        raise TypeError(f"a prompt is a str or a dict with 'prompt_token_ids', not {type(prompt).__name__}")
