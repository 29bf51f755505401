"""Models by name from a Hub: huggingface_hub's own client against a stand-in Hub on 127.0.0.1
(fake_hub.py, HF_ENDPOINT) serving tiny real models: a safetensors repo, a GGUF repo of three
quants (one split in three shards) and a LLaVA GGUF with two mmproj files. Every command runs as a
subprocess with its own HF_HOME, as a user runs it: `pull`, `serve NAME`, `serve -hf NAME:QUANT`,
`list`, `rm`, offline mode, a download cut and resumed, a corrupt file caught."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import gguf
import numpy as np
import pytest

import conftest
from conftest import cache_dir, gguf_from_hf, tiny_checkpoint_path, wait_until_serving
from fake_hub import FakeHub

QWEN, GGUF_REPO, LLAVA, BIG = "tiny-org/tiny-qwen3", "tiny-org/tiny-qwen3-GGUF", "tiny-org/tiny-llava-GGUF", "tiny-org/big"
TOKEN = "hf_fake_token_for_tests"
PROMPT = "Hello there"


# ---- the tiny models ---------------------------------------------------------------------------


def tiny_qwen3() -> Path:
    return tiny_checkpoint_path("qwen3", head_dim=16)       # the kernels' head_dim: a multiple of 16


def _gguf_parts(ckpt: Path) -> tuple[dict, str, dict]:
    """(tensors, arch, metadata) gguf_from_hf writes for the tiny Qwen3."""
    seen = {}
    original = conftest.write_gguf

    def capture(path, tensors, arch="llama", meta=None):
        seen.update(tensors=tensors, arch=arch, meta=meta)
        return path
    conftest.write_gguf = capture
    try:
        gguf_from_hf(ckpt, Path("unused.gguf"), "qwen3")
    finally:
        conftest.write_gguf = original
    return seen["tensors"], seen["arch"], seen["meta"]


def _write(path: Path, tensors: dict, arch: str, meta: dict, qtype: str | None = None,
           split_max_tensors: int = 0) -> list[Path]:
    """The tiny model as a GGUF of type qtype (2-D weights; F32 when None), split as asked; its files."""
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    conftest.add_gguf_metadata(w, meta)
    for name, (data, _) in tensors.items():
        if qtype == "Q8_0" and data.ndim == 2:
            t = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(data.astype(np.float32), t), raw_dtype=t)
        elif qtype == "F16" and data.ndim == 2:
            w.add_tensor(name, data.astype(np.float16))
        else:
            w.add_tensor(name, data.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sorted(path.parent.glob(path.stem + "*.gguf"))


@pytest.fixture(scope="module")
def models():
    """Local files of the tiny models: the HF directory, GGUFs by quant, the split F32, LLaVA."""
    ckpt = tiny_qwen3()
    out = cache_dir("hub_models_")
    tensors, arch, meta = _gguf_parts(ckpt)
    files = {"hf": ckpt}
    for q in ("F16", "Q8_0", "F32"):
        (out / q).mkdir()
        (files[q],) = _write(out / q / f"tiny-qwen3-{q}.gguf", tensors, arch, meta, None if q == "F32" else q)
    (out / "split").mkdir()
    files["split"] = _write(out / "split" / "tiny-qwen3-F32.gguf", tensors, arch, meta, None, split_max_tensors=12)
    assert len(files["split"]) == 3, files["split"]
    sys.path.insert(0, str(Path(__file__).parent.parent / "multimodal"))
    from llava_checkpoint import llava_checkpoint
    _, files["llava"], files["mmproj"] = llava_checkpoint()
    return files


@pytest.fixture(scope="module")
def hub(models):
    h = FakeHub()
    hf = models["hf"]
    h.add_repo(QWEN, {**{f.name: f for f in hf.iterdir() if f.is_file()},
                      "README.md": b"# tiny\n", "original/consolidated.pth": os.urandom(4096),
                      "onnx/model.onnx": os.urandom(4096)})
    h.add_repo(GGUF_REPO, {"README.md": b"# tiny GGUF\n", "tiny-qwen3-F16.gguf": models["F16"],
                           "tiny-qwen3-Q8_0.gguf": models["Q8_0"],
                           **{p.name: p for p in models["split"]}})
    h.add_repo(LLAVA, {"tiny-llava-F32.gguf": models["llava"], "mmproj-tiny-llava-F32.gguf": models["mmproj"],
                       "mmproj-tiny-llava-F16.gguf": models["mmproj"].read_bytes() + bytes(32)})
    # a model whose weights are larger than huggingface_hub's 10 MiB read chunk: a cut leaves bytes behind
    h.add_repo(BIG, {"config.json": (hf / "config.json").read_bytes(), "model.safetensors": os.urandom(24 << 20)})
    h.url = h.start()
    yield h
    h.stop()


@pytest.fixture
def env(hub, tmp_path):
    e = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN,
         "LITE_LLM_BUILD_VARIANTS": os.environ.get("LITE_LLM_BUILD_VARIANTS", "")}
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "LITE_LLM_DEBUG"):
        e.pop(k, None)
    return e


def cli(*args: str, env: dict, timeout: float = 300) -> tuple[int, list[str]]:
    proc = subprocess.run([sys.executable, "-m", "lite_llm", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    return proc.returncode, [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]


def repo_dir(env: dict, repo_id: str) -> Path:
    return Path(env["HF_HOME"]) / "hub" / ("models--" + repo_id.replace("/", "--"))


def snapshot_files(env: dict, repo_id: str) -> set[str]:
    snaps = repo_dir(env, repo_id) / "snapshots"
    return {str(p.relative_to(c)) for c in snaps.iterdir() for p in c.rglob("*") if p.is_file()}


@functools.lru_cache(maxsize=None)
def reference_text(path: Path) -> str:
    """The greedy completion of LLM over the local file or directory, in this process."""
    from lite_llm import LLM, SamplingParams
    llm = LLM(str(path), dtype="float32")
    return llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].text


def served_text(args: list[str], env: dict) -> tuple[str, list[str], dict]:
    """(completion text, server log, /v1/models) of `serve ARGS` on a free port."""
    proc = subprocess.Popen([sys.executable, "-m", "lite_llm", "serve", *args, "--port", "0", "--dtype", "float32",
                             "--disable-log-requests"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True, env=env)
    try:
        url, lines = wait_until_serving(proc, timeout=300)
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
            listed = json.load(r)
        name = listed["data"][0]["id"]
        body = json.dumps({"model": name, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            text = json.load(r)["choices"][0]["text"]
        return text, lines, listed
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


# ---- safetensors -------------------------------------------------------------------------------


def test_pull_fetches_only_the_models_files_into_the_hf_cache(hub, env):
    before = len(hub.requests)
    code, lines = cli("pull", QWEN, env=env)
    assert code == 0, lines
    assert "checked" in lines[-2] and QWEN in lines[-2], lines
    files = snapshot_files(env, QWEN)
    assert "model.safetensors" in files and "config.json" in files and "tokenizer.json" in files, files
    assert not {"README.md", "original/consolidated.pth", "onnx/model.onnx"} & files, files
    fetched = {r[1].rsplit("/", 1)[-1] for r in hub.requests[before:] if r[0] == "GET" and "/resolve/" in r[1]}
    assert fetched == {f.rsplit("/", 1)[-1] for f in files}, fetched
    # huggingface_hub's layout: the snapshot links to a blob named by the file's sha256; refs/main -> commit
    repo = repo_dir(env, QWEN)
    commit = (repo / "refs" / "main").read_text()
    link = repo / "snapshots" / commit / "model.safetensors"
    data = (Path(tiny_qwen3()) / "model.safetensors").read_bytes()
    assert link.is_symlink() and Path(os.path.realpath(link)).name == hashlib.sha256(data).hexdigest()
    ours = [r for r in hub.requests[before:] if QWEN in r[1]]
    assert ours and all(r[3] == f"Bearer {TOKEN}" for r in ours), "HF_TOKEN not sent"


def test_serve_by_name_answers_as_the_local_checkpoint(hub, env, models):
    text, lines, listed = served_text([QWEN], env)
    assert listed["data"][0]["id"] == QWEN
    assert text == reference_text(models["hf"])
    assert text.strip(), "an empty completion proves nothing"


def test_python_api_takes_the_name(hub, env, models):
    code = ("from lite_llm import LLM, SamplingParams; import json; llm = LLM(%r, dtype='float32'); "
            "print(json.dumps(llm.generate([%r], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].text))"
            % (QWEN, PROMPT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == reference_text(models["hf"])


# ---- GGUF --------------------------------------------------------------------------------------


def test_serve_picks_the_gguf_of_the_quant_tag_case_insensitive(hub, env, models):
    before = len(hub.requests)
    text, lines, listed = served_text([f"{GGUF_REPO}:q8_0"], env)
    assert listed["data"][0]["id"] == f"{GGUF_REPO}:q8_0"
    fetched = {r[1].rsplit("/", 1)[-1] for r in hub.requests[before:] if r[0] == "GET" and "/resolve/" in r[1]}
    assert fetched == {"tiny-qwen3-Q8_0.gguf"}, fetched
    assert text == reference_text(models["Q8_0"])


def test_hf_flag_fetches_and_joins_every_shard(hub, env, models):
    text, lines, listed = served_text(["-hf", f"{GGUF_REPO}:F32"], env)
    assert snapshot_files(env, GGUF_REPO) == {p.name for p in models["split"]}
    assert text == reference_text(models["F32"])     # the split model answers as the single file


@pytest.mark.parametrize("name,phrase", [
    (f"{GGUF_REPO}:Q4_K_M", "has no GGUF file of quant Q4_K_M (available: F16, F32, Q8_0)"),
    (GGUF_REPO, "holds several GGUF models: pick one as tiny-org/tiny-qwen3-GGUF:QUANT (available: F16, F32, Q8_0)"),
    ("tiny-org/no-such-model", "no such model on http://127.0.0.1:"),
    (f"{QWEN}:Q8_0", "holds safetensors weights, no GGUF files"),
])
def test_a_name_that_does_not_resolve_is_one_clear_line(hub, env, name, phrase):
    code, lines = cli("serve", name, "--port", "0", env=env)
    assert code == 1 and not any("Traceback" in ln for ln in lines), lines
    assert len(lines) == 2 and phrase in lines[0], lines
    assert not repo_dir(env, GGUF_REPO).joinpath("blobs").exists()      # nothing fetched


def test_revision_is_fetched_and_served(hub, env, models):
    commit = hub.add_repo(GGUF_REPO + "-rev", {"tiny-qwen3-Q8_0.gguf": models["Q8_0"]}, revision="v1")
    code, lines = cli("serve", f"{GGUF_REPO}-rev", "--revision", "main", "--port", "0", env=env)
    assert code == 1 and "no revision 'main'" in lines[0], lines
    code, lines = cli("pull", f"{GGUF_REPO}-rev", "--revision", "v1", env=env)
    assert code == 0, lines
    assert (repo_dir(env, GGUF_REPO + "-rev") / "refs" / "v1").read_text() == commit
    code, lines = cli("list", env=env)
    assert any(ln.startswith(f"{GGUF_REPO}-rev:Q8_0@v1 ") for ln in lines), lines


def test_python_api_takes_a_revision(hub, env, models):
    hub.add_repo(GGUF_REPO + "-pyrev", {"tiny-qwen3-Q8_0.gguf": models["Q8_0"]}, revision="v2")
    code = ("from lite_llm import LLM, SamplingParams; import json, sys; name = %r\n"
            "try:\n    LLM(name, dtype='float32')\nexcept Exception as e:\n    print('main:', e)\n"
            "llm = LLM(name, dtype='float32', revision='v2')\n"
            "print(json.dumps(llm.generate([%r], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].text))"
            % (GGUF_REPO + "-pyrev", PROMPT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert any(ln.startswith("main:") and "no revision 'main'" in ln for ln in lines), lines
    assert json.loads(lines[-1]) == reference_text(models["Q8_0"])


def test_the_mmproj_beside_a_vision_gguf_comes_with_it(hub, env, models):
    # the model answers a chat with an image: its projector was found and loaded
    code = ("from lite_llm import LLM, SamplingParams; import base64, io, json; from PIL import Image\n"
            "llm = LLM(%r, dtype='float32', block_size=16, max_num_batched_tokens=16)\n"
            "buf = io.BytesIO(); Image.new('RGB', (40, 30), (200, 20, 90)).save(buf, format='PNG')\n"
            "url = 'data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode()\n"
            "msg = [{'role': 'user', 'content': [{'type': 'image_url', 'image_url': {'url': url}}, "
            "{'type': 'text', 'text': 'What is it?'}]}]\n"
            "out = llm.chat(msg, SamplingParams(temperature=0, max_tokens=2))[0]\n"
            "text = llm.chat([{'role': 'user', 'content': 'What is it?'}], SamplingParams(temperature=0, max_tokens=2))[0]\n"
            "print(json.dumps([llm.info['mmproj'], len(out.prompt_token_ids) - len(text.prompt_token_ids), "
            "len(out.outputs[0].token_ids)]))" % LLAVA)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    mmproj, image_rows, generated = json.loads(proc.stdout.strip().splitlines()[-1])
    assert os.path.basename(mmproj) == "mmproj-tiny-llava-F32.gguf"   # the model's own tag
    assert image_rows > 0 and generated == 2
    assert snapshot_files(env, LLAVA) == {"tiny-llava-F32.gguf", "mmproj-tiny-llava-F32.gguf"}


# ---- offline, resume, corruption -----------------------------------------------------------------


@pytest.mark.slow      # one of the longest: the slow tier (tests/conftest.py TIERS), which CI runs
def test_offline_serves_from_the_cache_without_a_request(hub, env, models):
    code, lines = cli("pull", f"{GGUF_REPO}:Q8_0", env=env)
    assert code == 0, lines
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    before = len(hub.requests)
    text, lines, _ = served_text([f"{GGUF_REPO}:Q8_0"], offline)
    assert text == reference_text(models["Q8_0"])
    assert len(hub.requests) == before, hub.requests[before:]
    code, lines = cli("serve", f"{GGUF_REPO}:F16", "--port", "0", env=offline)
    assert code == 1 and "no GGUF file of quant F16 (available: Q8_0)" in lines[0], lines
    code, lines = cli("serve", QWEN, "--port", "0", env=offline)
    assert code == 1 and len(lines) == 2, lines
    assert f"{QWEN}: not in the local Hugging Face cache ({env['HF_HOME']}/hub), and HF_HUB_OFFLINE=1" in lines[0]
    assert len(hub.requests) == before


@pytest.mark.slow      # one of the longest: the slow tier (tests/conftest.py TIERS), which CI runs
def test_a_hub_out_of_reach_leaves_the_cache(hub, env, models):
    code, lines = cli("pull", f"{GGUF_REPO}:Q8_0", env=env)
    assert code == 0, lines
    gone = {**env, "HF_ENDPOINT": "http://127.0.0.1:9"}       # nothing listens there
    text, lines, _ = served_text([f"{GGUF_REPO}:Q8_0"], gone)
    assert text == reference_text(models["Q8_0"])
    assert any("http://127.0.0.1:9 cannot be reached (ConnectError): using the cached copy" in ln for ln in lines), lines
    code, lines = cli("serve", QWEN, "--port", "0", env=gone)
    assert code == 1 and len(lines) == 2, lines
    assert lines[0].endswith(f"{QWEN}: not in the local Hugging Face cache ({env['HF_HOME']}/hub), and "
                             "http://127.0.0.1:9 cannot be reached (ConnectError)"), lines
    code, lines = cli("serve", QWEN, "-hf", QWEN, "--port", "0", env=gone)
    assert code == 1 and "both name a model: give one" in lines[0], lines


def _stalled_pull(hub, env):
    """`pull BIG` started while the Hub stalls its weights halfway (until the event is set):
    (the file's bytes, the release event, the cache's blobs directory, the pull process)."""
    import threading
    data = hub.repos[BIG]["commits"][hub.repos[BIG]["refs"]["main"]]["model.safetensors"]
    release = threading.Event()
    hub.stall["model.safetensors"] = (len(data) // 2, release)
    proc = subprocess.Popen([sys.executable, "-m", "lite_llm", "pull", BIG], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return data, release, repo_dir(env, BIG) / "blobs", proc


def test_an_interrupted_download_resumes_where_it_stopped(hub, env):
    data, release, blobs, proc = _stalled_pull(hub, env)
    try:
        deadline = time.time() + 120
        partial = []
        while time.time() < deadline:     # huggingface_hub writes 10 MiB reads: wait for the first
            partial = [p for p in blobs.glob("*.incomplete")] if blobs.exists() else []
            if partial and partial[0].stat().st_size >= 10 << 20:
                break
            time.sleep(0.1)
        assert partial, "no partial download appeared"
        # the process killed mid-download (a signal's disposition differs between a terminal and
        # a background job: SIGKILL is the same everywhere, and leaves what a crash leaves)
        proc.kill()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        del hub.stall["model.safetensors"]
        release.set()
    kept = partial[0].stat().st_size
    assert proc.returncode != 0 and 0 < kept < len(data)
    served_before = hub.served.get("model.safetensors", 0)
    code, lines = cli("pull", BIG, env=env)
    assert code == 0, lines
    assert any(f"resuming model.safetensors at {kept} of {len(data)} bytes" in ln for ln in lines), lines
    assert hub.gets("model.safetensors")[-1][2] == f"bytes={kept}-"
    assert hub.served["model.safetensors"] - served_before == len(data) - kept
    blob = blobs / hashlib.sha256(data).hexdigest()
    assert hashlib.sha256(blob.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert not list(blobs.glob("*.incomplete"))


def test_a_cut_connection_is_resumed_in_the_same_run(hub, env):
    data, release, blobs, proc = _stalled_pull(hub, env)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not any(p.stat().st_size >= 10 << 20 for p in blobs.glob("*.incomplete")):
            time.sleep(0.1)
        del hub.stall["model.safetensors"]
        release.set()               # the server closes the connection mid-body
        out, err = proc.communicate(timeout=120)
    finally:
        hub.stall.pop("model.safetensors", None)
        release.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    rng = hub.gets("model.safetensors")[-1][2]     # huggingface_hub's own retry, from what it wrote
    assert rng and (10 << 20) <= int(rng[len("bytes="):-1]) <= len(data) // 2, rng
    assert (blobs / hashlib.sha256(data).hexdigest()).read_bytes() == data


def test_a_corrupt_download_is_refused_and_a_damaged_cache_refetched(hub, env):
    hub.corrupt.add("model.safetensors")
    try:
        code, lines = cli("pull", QWEN, env=env)
    finally:
        hub.corrupt.discard("model.safetensors")
    assert code == 1 and len(lines) == 2 and not any("Traceback" in ln for ln in lines), lines
    assert "the download of model.safetensors is corrupt (sha256" in lines[0], lines
    blobs = repo_dir(env, QWEN) / "blobs"
    data = (Path(tiny_qwen3()) / "model.safetensors").read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    assert not (blobs / digest).exists() and not list(blobs.glob("*.incomplete"))
    code, lines = cli("pull", QWEN, env=env)
    assert code == 0, lines
    blob = blobs / digest
    damaged = bytearray(blob.read_bytes())
    damaged[len(damaged) // 2] ^= 1                # one bit flipped on disk
    blob.chmod(0o644)
    blob.write_bytes(bytes(damaged))
    code, lines = cli("pull", QWEN, env=env)
    assert code == 0, lines
    assert any("the cached model.safetensors is damaged (sha256" in ln for ln in lines), lines
    assert blob.read_bytes() == data


# ---- list and rm -------------------------------------------------------------------------------


def test_list_and_rm(hub, env):
    for name in (QWEN, f"{GGUF_REPO}:Q8_0", f"{GGUF_REPO}:F16"):
        code, lines = cli("pull", name, env=env)
        assert code == 0, lines
    code, lines = cli("list", env=env)
    assert code == 0 and lines[0].split() == ["NAME", "SIZE", "FORMAT", "QUANT", "LAST", "USED"], lines
    rows = {ln.split()[0]: ln.split() for ln in lines[1:]}
    assert set(rows) == {QWEN, f"{GGUF_REPO}:Q8_0", f"{GGUF_REPO}:F16"}, lines
    assert rows[QWEN][3:5] == ["safetensors", "F32"] and rows[f"{GGUF_REPO}:Q8_0"][3:5] == ["gguf", "Q8_0"]
    assert lines[1].split()[0] == f"{GGUF_REPO}:F16"         # the last used first
    code, lines = cli("rm", f"{GGUF_REPO}:q8_0", env=env)
    assert code == 0 and "tiny-qwen3-Q8_0.gguf" in lines[0], lines
    assert snapshot_files(env, GGUF_REPO) == {"tiny-qwen3-F16.gguf"}
    assert len(list((repo_dir(env, GGUF_REPO) / "blobs").iterdir())) == 1
    code, lines = cli("rm", QWEN, env=env)
    assert code == 0 and not repo_dir(env, QWEN).exists(), lines
    code, lines = cli("list", env=env)
    assert [ln.split()[0] for ln in lines[1:]] == [f"{GGUF_REPO}:F16"], lines
    code, lines = cli("rm", QWEN, env=env)
    assert code == 1 and len(lines) == 2 and f"{QWEN}: not in the local Hugging Face cache" in lines[0], lines
