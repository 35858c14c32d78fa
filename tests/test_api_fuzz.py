"""Schemathesis over every operation of the OpenAPI spec, against `launch.py --demo --api-key`, with
and without the key: no server error, and every answer (status, content type, headers, body) as
the spec documents it. A fixed example budget keeps it to a few minutes on two CPU cores."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.test_app_support import DemoServer

KEY = "fuzz-key-51c0"
EXAMPLES_PER_OPERATION = 8
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with DemoServer(tmp_path_factory.mktemp("fuzz"), "--device", "cpu", "--no-compile", "--api-key", KEY) as s:
        yield s
        assert KEY not in s.log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json", headers={"Authorization": f"Bearer {KEY}"})


schema = schemathesis.pytest.from_fixture("api_schema")


def bounded(case):
    """Generated bodies keep their shape, but ask for little audio: the budget is examples, not
    minutes of CPU decoding."""
    if isinstance(case.body, dict):
        if "max_new_tokens" in case.body or case.path in ("/v1/tts", "/v1/tts/batch", "/v1/audio/speech"):
            case.body["max_new_tokens"] = 4
        if isinstance(case.body.get("texts"), list):
            case.body["texts"] = case.body["texts"][:2]
    return case


def test_operations_cover_the_api(api_schema):
    paths = {op.ok().path for op in api_schema.get_all_operations()}
    assert {"/v1/tts", "/v1/audio/speech", "/v1/tts/batch", "/v1/references/add", "/v1/references/list",
            "/v1/references/delete", "/v1/references/update", "/health", "/ready", "/metrics"} <= paths


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_with_the_key(case):
    bounded(case).call_and_validate(headers={"Authorization": f"Bearer {KEY}"}, checks=CHECKS, timeout=120)


@schema.parametrize()
@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_without_the_key(case):
    response = bounded(case).call_and_validate(headers={"Authorization": "Bearer not-the-key"}, checks=CHECKS,
                                               timeout=120)
    if case.path != "/health":
        # Nothing succeeds without the key: 401, or a 4xx for a request malformed before any key
        # matters (a method the route does not take, a multipart body that cannot be parsed).
        assert 400 <= response.status_code < 500 and response.status_code != 404, response.status_code


def test_the_spec_needs_the_key(server):
    assert httpx.get(f"{server.url}/openapi.json").status_code == 401
