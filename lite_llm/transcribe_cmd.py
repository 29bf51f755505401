"""`lite-llm transcribe FILE --model DIR`: speech to text with a Whisper checkpoint, printed as
text, json, verbose_json, srt or vtt (OpenAI's audio formats), a progress bar on stderr for long
files."""
from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    from lite_llm.multimodal.transcribe import FORMATS
    p.add_argument("file", help="audio file: WAV, FLAC, MP3, OGG, WebM or M4A")
    p.add_argument("--model", required=True,
                   help="a Whisper checkpoint: an HF WhisperForConditionalGeneration directory or a whisper.cpp "
                        "ggml-*.bin")
    p.add_argument("--language", default=None, help="spoken language, a code or name (default: detected)")
    p.add_argument("--task", choices=("transcribe", "translate"), default="transcribe",
                   help="transcribe, or translate to English")
    p.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")
    p.add_argument("--prompt", default=None, help="text the decoder reads first: spellings, names, style")
    p.add_argument("--temperature", type=float, default=None,
                   help="one sampling temperature (default: 0, then 0.2 .. 1.0 where a window fails Whisper's checks)")
    p.add_argument("--beam-size", type=int, default=None,
                   help="beam search over this many beams at temperature 0 (openai-whisper's 5; default: greedy)")
    p.add_argument("--word-timestamps", action="store_true",
                   help="each word's start and end too (in --format verbose_json: its `words`)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="weights' format")
    p.add_argument("--output", "-o", default=None, help="write here instead of stdout")


def run(args) -> int:
    from lite_llm import LLM
    from lite_llm.multimodal.audio import AudioError
    from lite_llm.multimodal.transcribe import TranscriptionError, render
    llm = LLM(model=args.model, dtype=args.dtype)
    if llm.runner_type != "transcription":
        print(f"lite-llm transcribe: error: {args.model} is not a Whisper checkpoint", file=sys.stderr)
        return 2
    if args.word_timestamps and args.format != "verbose_json":
        print("lite-llm transcribe: error: --word-timestamps lists the words in --format verbose_json", file=sys.stderr)
        return 2
    kw = {} if args.temperature is None else {"temperature": args.temperature}
    if args.beam_size is not None:
        if args.beam_size < 1:
            print("lite-llm transcribe: error: --beam-size must be >= 1", file=sys.stderr)
            return 2
        kw["beam_size"] = args.beam_size
    try:
        result = llm.transcribe(args.file, language=args.language, task=args.task, prompt=args.prompt,
                                timestamps=True if args.format in ("srt", "vtt", "verbose_json") else None,
                                word_timestamps=args.word_timestamps, **kw)
    except (AudioError, TranscriptionError, OSError) as e:
        print(f"lite-llm transcribe: error: {e}", file=sys.stderr)
        return 1
    body, _ = render(result, args.format, ("segment", "word") if args.word_timestamps else ("segment",))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(body)
    else:
        sys.stdout.write(body if body.endswith("\n") else body + "\n")
    return 0
