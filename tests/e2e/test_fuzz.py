"""The HTTP API fuzzed from its own OpenAPI schema (schemathesis, seeded, bounded): no input gets
a server error or hangs, and the server stays healthy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from conftest import tiny_spec
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from bevy_gguf.soak.driver import ServerProcess
from bevy_gguf.synth import ensure_model


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    model = ensure_model(tiny_spec(layers=4, experts=16, top_k=2), progress=False)
    server = ServerProcess(model, ["--parallel", "4", "--expert-cache", "50%", "--ctx-size", "96"],
                           Path(tmp_path_factory.mktemp("fuzz")) / "server.log")
    yield server
    assert httpx.get(server.url + "/health", timeout=10).json()["status"] == "ok"
    assert server.stop() == 0


@pytest.fixture(scope="module")
def api_schema(fuzzed: ServerProcess) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(fuzzed.url + "/openapi.json")


def test_no_input_gets_a_server_error(api_schema: schemathesis.BaseSchema) -> None:
    """Every operation, 150 generated cases each (schemathesis's pytest plugin does not run on
    pytest 9, so hypothesis drives the strategies here)."""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/v1/models"}
    for op in operations:
        @given(case=op.as_strategy())
        @settings(max_examples=150, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def calls(case: schemathesis.Case) -> None:
            response = case.call(timeout=60)  # a hang fails here
            case.validate_response(response, checks=[not_a_server_error])

        calls()
