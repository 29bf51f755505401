"""Names and file choice of models by name (no network): the spellings of the name, the quant tag
of GGUF files as the big repos name them, which files a repo's model needs; and split GGUF files
read as one."""
from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest

from lite_llm.model import hub, packed_cache
from lite_llm.model.gguf import GGUFFile
from lite_llm.model.loader import ModelLoadError


@pytest.mark.parametrize("name,repo,tag", [
    ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B", None),
    ("unsloth/Qwen3-8B-GGUF:Q4_K_M", "unsloth/Qwen3-8B-GGUF", "Q4_K_M"),
    ("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:iq4_xs", "bartowski/Llama-3.2-1B-Instruct-GGUF", "iq4_xs"),
    ("https://huggingface.co/ggml-org/gemma-3-1b-it-GGUF", "ggml-org/gemma-3-1b-it-GGUF", None),
])
def test_names(name, repo, tag):
    assert hub.parse_name(name) == hub.HubName(repo, tag)


@pytest.mark.parametrize("name", ["model.gguf", "./org/name", "/abs/org/name", "~/org/name", "a/b/c", "org/name:bad tag"])
def test_paths_are_no_names(name):
    assert hub.parse_name(name) is None


@pytest.mark.parametrize("path,tag", [
    ("Qwen3-8B-Q4_K_M.gguf", "Q4_K_M"), ("qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf", "Q4_K_M"),
    ("Meta-Llama-3-8B-Instruct.Q8_0.gguf", "Q8_0"), ("Qwen3-8B-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
    ("Llama-3.2-1B-Instruct-IQ4_XS.gguf", "IQ4_XS"), ("gemma-3-1b-it-BF16.gguf", "BF16"),
    ("gpt-oss-20b-MXFP4.gguf", "MXFP4"), ("Q8_0/Qwen3-32B-Q8_0-00001-of-00002.gguf", "Q8_0"),
    ("BF16/model-00001-of-00003.gguf", "BF16"), ("model.gguf", None),
])
def test_quant_tags(path, tag):
    assert hub.quant_of(path) == tag


REPO = ["README.md", "Qwen3-8B-Q4_K_M.gguf", "Qwen3-8B-UD-Q4_K_XL.gguf", "Qwen3-8B-Q8_0.gguf",
        "BF16/Qwen3-8B-BF16-00002-of-00002.gguf", "BF16/Qwen3-8B-BF16-00001-of-00002.gguf",
        "mmproj-F16.gguf", "mmproj-F32.gguf"]


def test_gguf_choice():
    pick = lambda name, files=REPO: hub.pick_gguf(hub.parse_name(name), files, "the repo")  # noqa: E731
    assert pick("o/r") == ["Qwen3-8B-Q4_K_M.gguf"]                    # llama.cpp's default tag
    assert pick("o/r:q8_0") == ["Qwen3-8B-Q8_0.gguf"]
    assert pick("o/r:Q4_K_XL") == pick("o/r:UD-Q4_K_XL") == ["Qwen3-8B-UD-Q4_K_XL.gguf"]
    assert pick("o/r:bf16") == ["BF16/Qwen3-8B-BF16-00001-of-00002.gguf", "BF16/Qwen3-8B-BF16-00002-of-00002.gguf"]
    with pytest.raises(hub.HubError, match=r"no GGUF file of quant Q5_K_M \(available: BF16, Q4_K_M, Q8_0, UD-Q4_K_XL\)"):
        pick("o/r:Q5_K_M")
    with pytest.raises(hub.HubError, match=r"several GGUF models: pick one as o/r:QUANT \(available: Q8_0, UD-Q4_K_XL\)"):
        pick("o/r", ["Qwen3-8B-Q8_0.gguf", "Qwen3-8B-UD-Q4_K_XL.gguf"])
    assert pick("o/r:qwen3-8b-q8_0.gguf") == ["Qwen3-8B-Q8_0.gguf"]              # a file by its own name
    assert pick("o/r:Qwen3-8B-BF16-00002-of-00002.gguf") == pick("o/r:bf16")      # any shard: the whole model
    twins = ["Qwen3-8B-Q8_0.gguf", "Qwen3-8B-Instruct-Q8_0.gguf"]
    with pytest.raises(hub.HubError, match=r"has 2 GGUF models of quant Q8_0 .*: name one as o/r:FILE.gguf"):
        pick("o/r:Q8_0", twins)
    assert pick("o/r:Qwen3-8B-Instruct-Q8_0.gguf", twins) == ["Qwen3-8B-Instruct-Q8_0.gguf"]
    with pytest.raises(hub.HubError, match=r"no GGUF model file other.gguf \(quants: BF16"):
        pick("o/r:other.gguf")
    with pytest.raises(hub.HubError, match="lacks shard"):
        pick("o/r:BF16", ["BF16/Qwen3-8B-BF16-00001-of-00002.gguf"])
    assert hub.pick_mmproj(REPO, "Q8_0") == "mmproj-F16.gguf" and hub.pick_mmproj(REPO, "F32") == "mmproj-F32.gguf"
    assert hub.pick_mmproj(REPO[:4], "Q8_0") is None


def test_safetensors_files():
    side = ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json", "README.md",
            "1_Pooling/config.json", "original/consolidated.pth", "pytorch_model.bin"]
    assert hub.safetensors_files(side + ["model.safetensors", "model.onnx"]) == [
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "1_Pooling/config.json",
        "model.safetensors"]
    sharded = hub.safetensors_files(side + ["model.safetensors.index.json", "model-00001-of-00002.safetensors"])
    assert sharded[-1] == "model.safetensors.index.json" and "model-00001-of-00002.safetensors" not in sharded
    mistral = hub.safetensors_files(["config.json", "consolidated.safetensors", "model-00001-of-00001.safetensors"])
    assert mistral == ["config.json", "model-00001-of-00001.safetensors"]


def test_a_split_gguf_reads_as_one_file(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {f"t{i}": rng.standard_normal((4, 32)).astype(np.float32) for i in range(3)}
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama", split_max_tensors=1)
    w.add_string("general.name", "split")
    for name, t in tensors.items():
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    first = tmp_path / "m-00001-of-00003.gguf"
    f = GGUFFile(str(first))
    assert f.metadata["general.name"] == "split" and sorted(f.tensors) == ["t0", "t1", "t2"]
    for name, t in tensors.items():
        np.testing.assert_array_equal(f.read(name), t)
        np.testing.assert_array_equal(f.read_rows(name, 1, 3), t[1:3])
    f.close()
    # the packed-weights cache keys a split model by all its shards
    assert [p[0] for p in packed_cache.source_files(str(first))] == [
        str(tmp_path / f"m-0000{i}-of-00003.gguf") for i in (1, 2, 3)]
    with pytest.raises(ModelLoadError, match="shard 2 of 3 of a split GGUF model: pass its first shard"):
        GGUFFile(str(tmp_path / "m-00002-of-00003.gguf"))
    (tmp_path / "copy").mkdir()
    shutil.copy(first, tmp_path / "copy" / first.name)
    shutil.copy(tmp_path / "m-00002-of-00003.gguf", tmp_path / "copy")
    with pytest.raises(ModelLoadError, match=r"m-00003-of-00003.gguf: shard 3 of 3 of .* is missing"):
        GGUFFile(str(tmp_path / "copy" / first.name))
