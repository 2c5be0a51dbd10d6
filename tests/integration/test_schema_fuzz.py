"""Schemathesis against the OpenAPI schema, on the ASGI app, on both backends: for valid
and invalid generated requests alike, never a 5xx, and every answer (status, content type,
body, headers) as the schema documents it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from sinal.api import create_app
from sinal.config import Settings
from sinal.ledger import Ledger

EXAMPLES = 12  # per operation and mode: the suite stays within a few minutes
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]


@pytest.fixture
def fuzzed(database_url: str, ledger_at: Ledger) -> Iterator[tuple[Any, dict[str, str]]]:
    account = ledger_at.create_account("Loja Fuzz")
    contact = ledger_at.create_contact(account.id, email="ana@example.com")
    key, _ = ledger_at.create_api_key(account.id, ["ingest", "read", "admin"])
    ledger_at.emit_event(account_id=account.id, contact_id=contact.id, metric_name="Order Paid",
                         source="shopify", source_id="1", value="10")  # fmt: skip
    app = create_app(Settings(database_url=database_url, serve_worker=False))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    try:
        yield schema, {"Authorization": f"Bearer {key}"}
    finally:
        asgi.shutdown_lifespans()  # the app's lifespan: drain, close the pool


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_api_conforms_to_its_schema_and_never_answers_5xx(
    fuzzed: tuple[Any, dict[str, str]], mode: GenerationMode
) -> None:
    schema, headers = fuzzed
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15

    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any) -> None:
            case.call_and_validate(headers=dict(headers), checks=CHECKS)  # it adds to them

        try:
            check()
        except Unsatisfiable:
            # No invalid request exists for it (e.g. GET /healthz takes no input).
            assert mode == GenerationMode.NEGATIVE, operation.label
