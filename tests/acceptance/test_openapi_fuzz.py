"""Fuzz the OpenAPI document of the live gateway with schemathesis (a bounded number of examples per
operation): no request may get a 5xx, a stack trace, or an answer the document does not describe."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.acceptance.up import Up

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fuzz_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    d = tmp_path_factory.mktemp("fuzz")
    server = Up(f"sqlite:///{d}/tenure.db", d, workers=1, app="tests.acceptance.fuzz_app:app")
    yield server
    assert server.stop() == 0, server.log()


def test_every_operation_answers_as_documented(fuzz_up: Up) -> None:
    # Driven by hand rather than through schemathesis' pytest plugin, which does not load under this pytest.
    schema = schemathesis.openapi.from_url(fuzz_up.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    for op in operations:

        @settings(
            max_examples=25,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=op.as_strategy())
        def check(case: schemathesis.Case) -> None:
            response = case.call(base_url=fuzz_up.url, headers=fuzz_up.headers())
            assert response.status_code < 500, (case.method, case.formatted_path, response.text)
            assert "Traceback" not in response.text
            case.validate_response(response, headers=fuzz_up.headers())

        check()
    assert "Traceback" not in fuzz_up.log()
