"""schemathesis against /openapi.json, every check on: bodies generated from the document
(valid ones and ones that break it) and stateful sequences (create a response, then read,
cancel or delete it) sent over real HTTP. No answer is a 5xx, every answer matches the response
schema the document gives, and every body the document calls valid is accepted (ST202), but for
the few refusals no JSON Schema can state, each named below by the error the server gives.

Not run: negative_data_rejection (ST201). The server reads a null as an absent optional field
and takes 3.0 where an integer is due, as pydantic does under vLLM; the document lists the
strict spelling."""
from __future__ import annotations

import json
import urllib.request

import pytest

schemathesis = pytest.importorskip("schemathesis")
# every route of the document, 25 bodies each, and stateful sequences: minutes; the slow tier
pytestmark = pytest.mark.slow
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.openapi.checks import RejectedPositiveData  # noqa: E402
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance  # noqa: E402

# Refusals of a schema-valid body that depend on what no schema sees: the prompt's length in
# tokens (prompt + max_tokens within max_model_len), min_tokens against max_tokens (or its
# default), whether a JSON schema, regular expression or grammar compiles in the
# structured-output engine, and a stored response's state (only a background response can be
# cancelled, as OpenAI answers); the bounds on client-controlled work that a schema cannot
# state either: nesting depth of any JSON value, sizes in UTF-8 bytes, and what the chat template
# makes of the messages.
_UNSTATABLE = ("This model's maximum context length is", "min_tokens must be <= max_tokens",
               "invalid JSON schema", "invalid regex", "invalid grammar",
               "Only background responses can be cancelled.")
_UNSTATABLE_BOUNDS = ("nested deeper than", "bytes in all", "is longer than", "chat template ",
                      "too large for a forced tool call")


def _accepts_valid_bodies(ctx, response, case):
    try:
        return positive_data_acceptance(ctx, response, case)
    except RejectedPositiveData:
        try:
            message = json.loads(response.content)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            raise
        if response.status_code == 400 and (message.startswith(_UNSTATABLE)
                                             or any(bound in message for bound in _UNSTATABLE_BOUNDS)):
            return None
        raise


_CHECKS = {"excluded_checks": [negative_data_rejection, positive_data_acceptance],
           "additional_checks": [_accepts_valid_bodies]}


@pytest.fixture(scope="module")
def api(served):
    with urllib.request.urlopen(served.url + "/openapi.json", timeout=10) as r:
        document = json.load(r)
    schema = schemathesis.openapi.from_dict(document)
    schema.config.update(base_url=served.url)
    return schema


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_5xx_answers_match_the_document_and_valid_bodies_are_accepted(case):
    case.call_and_validate(**_CHECKS)


def test_stateful_sequences(api):
    machine = api.as_state_machine()

    class Checked(machine):
        def validate_response(self, response, case, additional_checks=(), **kwargs):
            case.validate_response(response, excluded_checks=_CHECKS["excluded_checks"],
                                   additional_checks=[*additional_checks, _accepts_valid_bodies])

    Checked.run(settings=settings(max_examples=30, stateful_step_count=4, deadline=None,
                                  suppress_health_check=list(HealthCheck)))
