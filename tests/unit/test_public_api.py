"""The public API: what `import sinal` promises."""

from __future__ import annotations

import sinal
import sinal.errors


def test_public_api_names_all_resolve() -> None:
    missing = [name for name in sinal.__all__ if not hasattr(sinal, name)]
    assert missing == []


def test_public_api_exposes_the_seed_names() -> None:
    for name in ("emit_event", "emit_many", "connect", "EmitEvent", "InvalidEvent",
                 "get_metric_category", "get_metric_label", "TRIGGER_TO_METRIC",
                 "METRIC_TO_TRIGGER", "METRIC_ORDER_PLACED"):  # fmt: skip
        assert name in sinal.__all__
    assert len([n for n in sinal.__all__ if n.startswith("METRIC_") and n.count("_") > 1]) >= 32


def test_public_api_has_no_duplicates() -> None:
    assert len(sinal.__all__) == len(set(sinal.__all__))


def test_public_api_exports_every_error_sinal_raises() -> None:
    """A caller catches sinal's errors from `sinal`: `InvalidQuery` (a bad filter, cursor
    or id given to the Python API) and `IdentityConflict` (update_contact) were only in
    `sinal.errors`."""
    raised = {
        name
        for name, value in vars(sinal.errors).items()
        if isinstance(value, type) and issubclass(value, sinal.SinalError)
        and not name.startswith("_")
    }  # fmt: skip
    assert {"InvalidQuery", "IdentityConflict"} <= raised
    assert sorted(raised - set(sinal.__all__)) == []
    assert all(getattr(sinal, name) is getattr(sinal.errors, name) for name in raised)
