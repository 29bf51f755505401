"""A user's everyday mistakes on the command line: one or two lines that say what is wrong and
what to do, a non-zero exit, and no traceback (unless --debug or LITE_LLM_DEBUG=1 asks for it).
Each case runs the real command as a subprocess; the port and file checks come before any model
loads, so each run takes about a second."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import gguf as gguf_lib
import numpy as np
import pytest


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> tuple[int, list[str]]:
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    full_env.pop("LITE_LLM_DEBUG", None)
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "lite_llm", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    return proc.returncode, lines


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory):
    root = tmp_path_factory.mktemp("mistakes")
    (root / "empty").mkdir()
    (root / "notes.gguf").write_bytes(b"these are my notes, not a model\n")
    arch = root / "foo-model"
    arch.mkdir()
    (arch / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"], "model_type": "foo"}))
    (root / "hf-home").mkdir()
    return root


def busy_port() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def case_args(name: str, root) -> tuple[list[str], str]:
    """(arguments, a phrase the message must contain) of each mistake."""
    return {
        "missing path": (["serve", str(root / "no-such-model")], "no such file or directory"),
        "not a GGUF file": (["serve", str(root / "notes.gguf")], "not a GGUF file"),
        "directory without config.json": (["serve", str(root / "empty")], "missing config.json"),
        "unknown hub id": (["serve", "no-such-org/no-such-model"], "not in the local Hugging Face cache"),
        "unsupported architecture": (["serve", str(root / "foo-model")], "'FooForCausalLM' is not supported"),
        "port out of range": (["serve", "--port", "99999"], "99999 is not a port number"),
        "port not a number": (["serve", "--port", "eighty"], "not a port number"),
        "host not of this machine": (["serve", "--host", "192.0.2.1"], "not an address of this machine"),
        "generate with a missing path": (["generate", "--model", str(root / "no-such-model"), "--prompt", "Hi"], "no such file"),
    }[name]


CASES = ["missing path", "not a GGUF file", "directory without config.json", "unknown hub id",
         "unsupported architecture", "port out of range", "port not a number", "host not of this machine",
         "generate with a missing path"]


@pytest.mark.parametrize("name", CASES)
def test_mistake_is_one_clear_message(name, mistakes):
    args, phrase = case_args(name, mistakes)
    code, lines = run_cli(*args, env={"HF_HOME": str(mistakes / "hf-home")})
    assert code != 0
    assert not any("Traceback" in ln for ln in lines), lines
    assert 1 <= len(lines) <= 2, lines
    assert phrase in lines[0], lines


def test_port_in_use_fails_before_the_model_loads(mistakes):
    sock = busy_port()
    try:
        port = sock.getsockname()[1]
        # the model path is wrong too: the port is checked first, so the port is what the user hears of
        code, lines = run_cli("serve", str(mistakes / "no-such-model"), "--port", str(port))
    finally:
        sock.close()
    assert code != 0
    assert not any("Traceback" in ln for ln in lines), lines
    assert 1 <= len(lines) <= 2, lines
    assert f"127.0.0.1:{port}" in lines[0] and "pick another --port" in lines[0], lines


@pytest.mark.parametrize("how", [["--debug"], []])
def test_debug_shows_the_traceback(how, mistakes):
    env = {} if how else {"LITE_LLM_DEBUG": "1"}
    code, lines = run_cli("serve", str(mistakes / "no-such-model"), *how, env=env)
    assert code != 0
    assert any("Traceback" in ln for ln in lines), lines
    assert "ModelLoadError" in lines[-1]


@pytest.mark.parametrize("source", ["gguf", "hf"])
def test_file_with_a_tensor_no_recipe_reads(source, tmp_path, tiny_checkpoint):
    """A checkpoint with a weight the family's recipe never reads (a variant it does not know)
    is refused in one or two lines naming the tensor, instead of running without it."""
    from conftest import gguf_from_hf
    from safetensors.numpy import load_file, save_file
    d = tmp_path / "m"
    shutil.copytree(tiny_checkpoint("llama"), d)
    sd = load_file(str(d / "model.safetensors"))
    sd["model.layers.1.self_attn.o_proj.bias"] = np.zeros(64, np.float32)
    save_file(sd, str(d / "model.safetensors"))
    model = str(d)
    if source == "gguf":
        model = str(gguf_from_hf(tiny_checkpoint("llama"), tmp_path / "m.gguf", "llama"))
        g = gguf_lib.GGUFReader(model)
        w = gguf_lib.GGUFWriter(str(tmp_path / "extra.gguf"), "llama")
        for field in g.fields.values():
            if not field.name.startswith(("GGUF.", "general.architecture")):
                w.add_key_value(field.name, field.contents(), field.types[0],
                                field.types[-1] if field.types[0] == gguf_lib.GGUFValueType.ARRAY else None)
        for t in g.tensors:
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=None)
        w.add_tensor("blk.1.attn_output.bias", np.zeros(64, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        model = str(tmp_path / "extra.gguf")
    code, lines = run_cli("generate", "--model", model, "--prompt", "Hi", "--max-tokens", "1", "--dtype", "float32")
    assert code != 0
    assert not any("Traceback" in ln for ln in lines), lines
    assert 1 <= len(lines) <= 2, lines
    name = "blk.1.attn_output.bias" if source == "gguf" else "model.layers.1.self_attn.o_proj.bias"
    assert f"recipe does not read: {name} (an unsupported variant" in lines[0], lines
