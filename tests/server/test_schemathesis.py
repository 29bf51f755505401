"""schemathesis against /openapi.json: bodies generated from the document (valid ones and
ones that break it) sent over real HTTP; no answer is a 5xx and every answer matches the
response schema the document gives (the document and the validator agree)."""
from __future__ import annotations

import json
import urllib.request

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error, response_schema_conformance  # noqa: E402


@pytest.fixture(scope="module")
def api(served):
    with urllib.request.urlopen(served.url + "/openapi.json", timeout=10) as r:
        document = json.load(r)
    schema = schemathesis.openapi.from_dict(document)
    schema.config.update(base_url=served.url)
    return schema


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_5xx_and_answers_match_the_document(case):
    case.call_and_validate(checks=[not_a_server_error, response_schema_conformance])
