"""bench lora on a tiny checkpoint: it runs base, one-adapter and mixed batches in one engine and
reports each LoRA figure beside the base's (no speed is asserted: figures are measurements)."""
import json

from lite_llm.cli import main


def test_bench_lora_reports_base_lora_and_mixed_batches(tiny_checkpoint, capsys):
    path = tiny_checkpoint("llama")
    assert main(["bench", "lora", "--model", str(path), "--dtype", "float32", "--batch-sizes", "1,3",
                 "--input-len", "8", "--output-len", "4", "--num-iters", "1", "--warmup", "0",
                 "--lora-rank", "8", "--num-adapters", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["lora_rank"] == 8 and result["num_adapters"] == 2 and result["lora_weight_mb"] > 0
    assert set(result["runs"]["1"]) == {"base", "lora"} and set(result["runs"]["3"]) == {"base", "lora", "mixed"}
    for runs in result["runs"].values():
        for figures in runs.values():
            assert figures["prefill_tok_s"] > 0 and figures["decode_tok_s"] > 0
