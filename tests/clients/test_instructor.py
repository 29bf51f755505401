"""instructor on an OpenAI-compatible base URL, as its documentation uses it:
`instructor.from_openai(OpenAI(base_url=...), mode=...)` in the modes an OpenAI-compatible
server answers (TOOLS: a named tool_choice; JSON: response_format json_object; JSON_SCHEMA:
response_format json_schema; MD_JSON: a ```json block in plain text), `create(response_model=...)`
with a flat and a nested model, lists (`Iterable[Model]`, `create_iterable`), `create_partial`
streaming and validation retries (`max_retries`: the first answer fails a validator, the re-asked
prompt's cue selects the fixed one), against answers the test wrote.

instructor is installed with --no-deps (README's test command): its pin jiter<0.15 conflicts with
openai 3.57's jiter>=0.16; these tests run it on the jiter the openai pin brings."""
from __future__ import annotations

import json
from typing import Iterable

import instructor
import jiter
import openai
import pytest
from instructor import Mode
from instructor.core import InstructorRetryException
from pydantic import BaseModel, field_validator

from .conftest import MODEL, book_server, call

ADA = {"name": "Ada", "age": 36}
ACME = {"name": "Acme", "address": {"city": "Paris", "country": "France"},
        "staff": [{"name": "Ada", "age": 36}, {"name": "Alan", "age": 41}]}
TEAM = {"tasks": [{"name": "Ada", "age": 36}, {"name": "Alan", "age": 41}, {"name": "Grace", "age": 45}]}
BOB_WRONG, BOB = {"name": "Bob", "age": -5}, {"name": "Bob", "age": 52}
MODES = [Mode.TOOLS, Mode.JSON, Mode.JSON_SCHEMA, Mode.MD_JSON]
# instructor's own words when it asks again after a failed validation (its reask messages)
REASK_CUE = {Mode.TOOLS: "Recall the function correctly, fix the errors"}
JSON_REASK_CUE = "Correct your JSON ONLY RESPONSE"


class User(BaseModel):
    name: str
    age: int

    @field_validator("age")
    @classmethod
    def not_negative(cls, age: int) -> int:
        if age < 0:
            raise ValueError("age must not be negative")
        return age


class Address(BaseModel):
    city: str
    country: str


class Company(BaseModel):
    name: str
    address: Address
    staff: list[User]


def written(mode: Mode, name: str, value: dict) -> str:
    """How the model writes value in a mode: a call of the tool named after the response model,
    bare JSON, or a ```json block."""
    text = json.dumps(value)
    if mode == Mode.TOOLS:
        return call(name, value)
    return f"Here it is:\n```json\n{text}\n```" if mode == Mode.MD_JSON else text


def book(mode: Mode) -> dict[str, str]:
    return {"Extract Ada": written(mode, "User", ADA),
            "Extract Acme": written(mode, "Company", ACME),
            "Stream Acme": written(mode, "PartialCompany", ACME),     # create_partial's tool
            "List the team": written(mode, "IterableUser", TEAM),
            "Register Bob": written(mode, "User", BOB_WRONG),
            REASK_CUE.get(mode, JSON_REASK_CUE): written(mode, "User", BOB)}


@pytest.fixture(scope="module", params=MODES, ids=lambda m: m.name)
def client(request):
    with book_server(book(request.param)) as server:
        raw = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        yield instructor.from_openai(raw, mode=request.param)


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_versions():
    """The verified versions (README): instructor 1.17.0 on the jiter openai 3.57 needs."""
    assert instructor.__version__ == "1.17.0" and openai.__version__ == "3.57.0"
    assert tuple(int(x) for x in jiter.__version__.split(".")[:2]) >= (0, 16)


def test_create_a_model(client):
    user = client.create(model=MODEL, response_model=User, messages=ask("Extract Ada"), max_tokens=200)
    assert isinstance(user, User) and user.model_dump() == ADA


def test_create_with_completion_gives_the_raw_answer(client):
    user, completion = client.create_with_completion(model=MODEL, response_model=User,
                                                     messages=ask("Extract Ada"), max_tokens=200)
    assert isinstance(user, User) and user.model_dump() == ADA and completion.model == MODEL
    assert completion.usage.completion_tokens > 0


def test_create_a_nested_model(client):
    company = client.create(model=MODEL, response_model=Company, messages=ask("Extract Acme"), max_tokens=300)
    assert isinstance(company, Company) and company.model_dump() == ACME
    assert company.address.city == "Paris" and [u.name for u in company.staff] == ["Ada", "Alan"]


def test_iterable_response_model(client):
    users = client.create(model=MODEL, response_model=Iterable[User], messages=ask("List the team"), max_tokens=300)
    assert [u.model_dump() for u in users] == TEAM["tasks"]


def test_create_iterable_streams_each_object(client):
    users = list(client.create_iterable(model=MODEL, response_model=User, messages=ask("List the team"),
                                        max_tokens=300))
    assert [u.model_dump() for u in users] == TEAM["tasks"] and all(isinstance(u, User) for u in users)


def _partials(client) -> list[dict]:
    return [p.model_dump() for p in client.create_partial(model=MODEL, response_model=Company,
                                                          messages=ask("Stream Acme"), max_tokens=300)]


def test_create_partial_ends_with_the_object(client):
    assert _partials(client)[-1] == ACME


def test_create_partial_snapshots_grow(client, request):
    if client.mode == Mode.TOOLS:
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            "the server sends a hermes call's arguments in one delta once the call is closed, "
            "not as they are written (vLLM and OpenAI stream them): one snapshot, the last")))
    snapshots = _partials(client)
    assert snapshots[-1] == ACME and len(snapshots) > 3
    assert snapshots[0]["name"] is None and snapshots[0]["address"]["city"] is None     # nothing yet
    assert any(s["name"] == "Acme" and s["address"]["city"] is None for s in snapshots)  # a field at a time
    staff = [len(s["staff"] or []) for s in snapshots]
    assert staff == sorted(staff) and 1 in staff                                          # the list grows


def test_validation_retry_is_answered_by_the_fixed_object(client):
    attempts = []
    client.on("completion:kwargs", lambda *args, **kwargs: attempts.append(kwargs["messages"]))
    try:
        user = client.create(model=MODEL, response_model=User, messages=ask("Register Bob"), max_tokens=200,
                             max_retries=2)
    finally:
        client.clear("completion:kwargs")
    assert user.model_dump() == BOB and len(attempts) == 2
    assert "age must not be negative" in json.dumps(attempts[1])       # the validator's error went back


def test_validation_retries_run_out(client):
    attempts = []
    client.on("completion:kwargs", lambda *args, **kwargs: attempts.append(kwargs["messages"]))
    try:
        with pytest.raises(InstructorRetryException) as err:
            client.create(model=MODEL, response_model=User, messages=ask("Register Bob"), max_tokens=200,
                          max_retries=0)
    finally:
        client.clear("completion:kwargs")
    assert "age must not be negative" in str(err.value) and err.value.n_attempts == len(attempts) == 1
