"""How the API writes its JSON answers."""

from __future__ import annotations

import json
from uuid import UUID

import pytest

from sinal.api.views import json_response


class _TaggedId(UUID):
    """A UUID subclass, which orjson does not write by itself."""


def test_json_response_writes_uuids_and_their_subclasses_as_their_text() -> None:
    body = {"event_id": UUID(int=7), "rejection_id": _TaggedId(int=8), "none": None}

    response = json_response(body)

    assert json.loads(bytes(response.body)) == {
        "event_id": "00000000-0000-0000-0000-000000000007",
        "rejection_id": "00000000-0000-0000-0000-000000000008",
        "none": None,
    }


def test_json_response_still_refuses_what_json_cannot_hold() -> None:
    with pytest.raises(TypeError):
        json_response({"when": object()})
