"""LoRA adapters through the HTTP server (real engine on a tiny random Llama, real HTTP on
127.0.0.1): a request picks an adapter by its `model` name, /v1/models lists adapters with
their parent, /v1/load_lora_adapter and /v1/unload_lora_adapter change them at run time,
behind the API key and only with --enable-lora."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from openai import NotFoundError, OpenAI

from conftest import make_peft_adapter, tiny_checkpoint_path
from lite_llm.llm import build_async_engine
from lite_llm.outputs import fold
from lite_llm.sampling_params import SamplingParams

from .conftest import serving, start_server

KEY = "sekret"
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _post(url: str, path: str, body: dict, key: str | None = KEY) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    base = tiny_checkpoint_path("llama")
    root = tmp_path_factory.mktemp("lora_server")
    a1 = make_peft_adapter(base, root / "a1", 8, 16, ALL, seed=1)
    a2 = make_peft_adapter(base, root / "a2", 4, 8, ["q_proj", "v_proj", "down_proj"], seed=2)
    engine, tokenizer, info = build_async_engine(model=str(base), dtype="float32", max_model_len=128, block_size=16,
                                              kv_cache_space=0.01, max_num_seqs=8, enable_lora=True, max_loras=2,
                                              max_lora_rank=8, lora_modules=[("sql", str(a1))])
    with serving(engine, tokenizer, info, "base", api_key=KEY, lora_root=str(root)) as server:
        yield server.url, engine, a2


def test_models_list_adapters_with_their_parent(served):
    url, _, _ = served
    client = OpenAI(base_url=url + "/v1", api_key=KEY)
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {"base", "sql"}
    assert cards["sql"].parent == "base" and cards["base"].parent is None
    assert client.models.retrieve("sql").parent == "base"


def test_a_request_picks_its_adapter_by_model_name(served):
    url, engine, _ = served
    client = OpenAI(base_url=url + "/v1", api_key=KEY)
    prompt = [5, 17, 200, 33, 90, 250, 7]
    texts = {}
    for model in ("base", "sql"):
        r = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True})
        texts[model] = r.choices[0].text
        assert r.model == model
    assert texts["sql"] != texts["base"]
    # the engine's own answer for the adapter, without HTTP
    direct = fold(engine.add_request("direct-sql", prompt, SamplingParams(temperature=0, max_tokens=8,
                                                                          ignore_eos=True), lora_request="sql"))
    assert direct.outputs[0].text == texts["sql"]
    with pytest.raises(NotFoundError):
        client.completions.create(model="nope", prompt=prompt, max_tokens=2)


def test_load_and_unload_at_run_time(served):
    url, _, a2 = served
    client = OpenAI(base_url=url + "/v1", api_key=KEY)
    prompt = [8, 1, 99, 40]
    with pytest.raises(NotFoundError):
        client.completions.create(model="chat", prompt=prompt, max_tokens=2)
    status, body = _post(url, "/v1/load_lora_adapter", {"lora_name": "chat", "lora_path": str(a2)})
    assert status == 200, body
    assert "chat" in {m.id for m in client.models.list().data}
    r = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       temperature=0)
    assert r.model == "chat" and r.choices[0].message.content is not None
    # loaded twice, or a third adapter into two slots: clear 400s
    status, body = _post(url, "/v1/load_lora_adapter", {"lora_name": "chat", "lora_path": str(a2)})
    assert status == 400 and "already been loaded" in body["error"]["message"]
    status, body = _post(url, "/v1/load_lora_adapter", {"lora_name": "third", "lora_path": str(a2)})
    assert status == 400 and "--max-loras" in body["error"]["message"]
    status, body = _post(url, "/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": "/nowhere"})
    assert status == 400 and "not a loadable adapter" in body["error"]["message"]
    status, body = _post(url, "/v1/load_lora_adapter", {"lora_path": str(a2)})
    assert status == 400 and body["error"]["param"] == "lora_name"
    status, body = _post(url, "/v1/unload_lora_adapter", {"lora_name": "chat"})
    assert status == 200, body
    with pytest.raises(NotFoundError):
        client.completions.create(model="chat", prompt=prompt, max_tokens=2)
    status, body = _post(url, "/v1/unload_lora_adapter", {"lora_name": "chat"})
    assert status == 404 and "cannot be found" in body["error"]["message"]
    # its slot is free again
    status, body = _post(url, "/v1/load_lora_adapter", {"lora_name": "chat2", "lora_path": str(a2)})
    assert status == 200, body
    assert _post(url, "/v1/unload_lora_adapter", {"lora_name": "chat2"})[0] == 200


def test_runtime_loading_reads_only_under_the_root_and_says_nothing_of_other_files(served, tmp_path):
    url, _, a2 = served
    root = a2.parent
    outside = make_peft_adapter(tiny_checkpoint_path("llama"), tmp_path / "outside", 4, 8, ["q_proj"], seed=3)
    (root / "link_out").symlink_to(outside)           # a symlink inside the root to an adapter outside it
    (root / "passwd_link").symlink_to("/etc/passwd")
    (root / "not_gguf.bin").write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    (root / "empty_dir").mkdir()
    answers = []
    for path in ("/etc/passwd", "/etc", "/nowhere", str(outside), "../" + outside.parent.name + "/outside",
                 "link_out", "passwd_link", "not_gguf.bin", "empty_dir", "no_such_file", ".", "/",
                 str(root) + "/../" + root.name + "/missing"):
        status, body = _post(url, "/v1/load_lora_adapter", {"lora_name": "probe", "lora_path": path})
        assert status == 400 and body["error"]["param"] == "lora_path", (path, body)
        answers.append(body["error"]["message"])
        text = json.dumps(body)
        for leak in ("root:x", "magic", "GGUF", "directory", "exist", "not found", "passwd", "adapter_config"):
            assert leak not in text, (path, text)
    assert len(set(answers)) == 1 and answers[0] == "'lora_path' is not a loadable adapter under the adapter root"
    # a path relative to the root, and an absolute one inside it, still load
    for path in (a2.name, str(a2)):
        status, body = _post(url, "/v1/load_lora_adapter", {"lora_name": "rel", "lora_path": path})
        assert status == 200, body
        assert _post(url, "/v1/unload_lora_adapter", {"lora_name": "rel"})[0] == 200


def test_runtime_loading_is_off_without_a_root(tmp_path, monkeypatch):
    import argparse

    from lite_llm.server import lora_routes
    base = tiny_checkpoint_path("llama")
    a = make_peft_adapter(base, tmp_path / "a", 4, 8, ["q_proj"], seed=4)
    engine, tokenizer, info = build_async_engine(model=str(base), dtype="float32", max_model_len=64, block_size=16,
                                              kv_cache_space=0.01, max_num_seqs=2, enable_lora=True, max_loras=1,
                                              max_lora_rank=8)
    with serving(engine, tokenizer, info, "base", api_key=KEY) as server:
        status, body = _post(server.url, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(a)})
        assert status == 404 and "--lora-root" in body["error"]["message"], body
        assert str(a) not in json.dumps(body)
        status, body = _post(server.url, "/v1/unload_lora_adapter", {"lora_name": "a"})
        assert status == 404 and "--lora-root" in body["error"]["message"], body
    p = argparse.ArgumentParser()
    lora_routes.add_arguments(p)
    assert lora_routes.lora_root(p.parse_args(["--enable-lora"])) is None
    assert lora_routes.lora_root(p.parse_args(["--enable-lora", "--lora-root", str(tmp_path)])) == str(tmp_path.resolve())
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    with pytest.raises(SystemExit, match="--lora-root"):
        lora_routes.lora_root(p.parse_args(["--enable-lora"]))
    with pytest.raises(SystemExit, match="needs --enable-lora"):
        lora_routes.lora_root(p.parse_args(["--lora-root", str(tmp_path)]))


def test_the_adapter_routes_need_the_key(served):
    url, _, a2 = served
    for path, body in (("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(a2)}),
                       ("/v1/unload_lora_adapter", {"lora_name": "sql"})):
        for key in (None, "wrong"):
            status, answer = _post(url, path, body, key=key)
            assert status == 401 and answer["error"]["code"] == "invalid_api_key"
    assert "sql" in {m.id for m in OpenAI(base_url=url + "/v1", api_key=KEY).models.list().data}


def test_without_enable_lora_the_routes_answer_404_and_flags_are_checked():
    from lite_llm.server import lora_routes
    served = start_server(api_key=KEY)
    try:
        status, body = _post(served.url, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/p"})
        assert status == 404 and "--enable-lora" in body["error"]["message"]
        assert _post(served.url, "/v1/unload_lora_adapter", {"lora_name": "x"}, key=None)[0] == 401
    finally:
        served.server.shutdown()
    import argparse
    p = argparse.ArgumentParser()
    lora_routes.add_arguments(p)
    with pytest.raises(SystemExit, match="needs --enable-lora"):
        lora_routes.engine_kwargs(p.parse_args(["--lora-modules", "a=/x"]))
    kw = lora_routes.engine_kwargs(p.parse_args(["--enable-lora", "--lora-modules", "a=/x",
                                                 '{"name": "b", "path": "/y"}', "--max-loras", "3"]))
    assert kw == dict(enable_lora=True, max_loras=3, max_lora_rank=16, lora_modules=[("a", "/x"), ("b", "/y")])
    with pytest.raises(ValueError, match="expected name=path"):
        lora_routes.engine_kwargs(p.parse_args(["--enable-lora", "--lora-modules", "nopath"]))
