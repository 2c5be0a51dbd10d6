"""Automations and integrations as the API and the CLI manage them: validate, store, show.

Thin on purpose: validation lives in `model` (automations) and `_validate_integration`
(connections); storage in the store's `AutomationStore` methods. What needs the account's
data is checked here: a sending step's `phone_number_id` must name one of the account's
WhatsApp connections when the automation is saved (422 `unknown_connection`), unless the
stored definition had it already (a connection deleted since does not make every later
PATCH fail; the step then fails when it would use it).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from functools import cache
from typing import Any, cast, get_args
from uuid import UUID

from sinal.automations.matching import explain_match, other_metric_decision
from sinal.automations.model import (
    MAX_NAME,
    InvalidAutomation,
    apply_patch,
    find_sealed_value,
    parse_automation,
    redact_secrets,
)
from sinal.automations.steps import DEFAULT_WHATSAPP_API
from sinal.catalog import METRIC_CHECKOUT_ABANDONED, METRIC_CHECKOUT_RECOVERED
from sinal.errors import FieldError, InvalidIntegration
from sinal.events import stamp
from sinal.ids import new_id
from sinal.integrations.checkouts import RECORDED_AFTER_ORDER, abandonment_id, recovery_id
from sinal.ledger import Ledger
from sinal.store.automations import (
    AutomationRow,
    AutomationStore,
    AutomationTitle,
    Execution,
    Integration,
    IntegrationKind,
    stopped_too_deep,
)
from sinal.store.base import StoredEvent
from sinal.store.commerce import STOPPED_BY_DISCONNECT, STOPPED_BY_ORDER, STOPPED_BY_RECOVERY
from sinal.urls import base_url_problem
from sinal.webhooks import DEFAULT_GRACE, MAX_GRACE_SECONDS

# A trace's reasons for an automation a Checkout Abandoned its order (or its store's
# disconnection) withdrew did not run (through): withdrawn before fan-out, recorded with its
# order, or its execution stopped.
_BEFORE_FAN_OUT = "the event was withdrawn from automations before they ran: "
_RECORDED_WITH_ORDER = _BEFORE_FAN_OUT + (
    "the checkout's order, placed after the checkout counted as abandoned, came before "
    "the abandonment was recorded (a worker's pass, or Yampi's cart.reminder), so it was "
    "recorded with the order "
    "(recorded_after_order): a customer who bought gets no abandoned-cart message"
)
_STOPPED = (
    "the event was withdrawn from automations after its execution was made: the execution "
    "was stopped (steps it had run stay done): "
)
_WITHDRAWN = (STOPPED_BY_ORDER, STOPPED_BY_RECOVERY, STOPPED_BY_DISCONNECT)

# Per kind: (required settings, optional settings with defaults, secret fields).
_KINDS: dict[str, tuple[tuple[str, ...], dict[str, Any], tuple[str, ...]]] = {
    "whatsapp": (
        ("phone_number_id",),
        {
            "api_base_url": DEFAULT_WHATSAPP_API,
            "name": None,
            "status_grace_seconds": int(DEFAULT_GRACE.total_seconds()),
        },
        ("secret", "verify_token", "access_token"),
    ),
    "ai": (("base_url", "model"), {"name": None}, ("api_key",)),
    "shopify": (
        (),
        {
            "abandon_after_minutes": 60,
            "order_grace_seconds": int(DEFAULT_GRACE.total_seconds()),
            "shop_domain": None,
            "name": None,
        },
        ("secret",),
    ),
    "yampi": ((), {"alias": None, "name": None}, ("secret",)),
}
# Optional settings that are text (at most MAX_NAME characters) when given.
_TEXT_SETTINGS = ("name", "shop_domain", "alias")
# The secrets sent as `Authorization: Bearer …` (header values are ASCII).
_BEARER_SECRETS = frozenset({"access_token", "api_key"})
_REQUIRED_SECRETS = {"whatsapp": ("secret", "access_token"), "shopify": ("secret",),
                     "yampi": ("secret",)}  # fmt: skip


class Automations:
    """The account-scoped operations on automations, integrations and executions."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.store = cast(AutomationStore, ledger.store)

    # -- integrations --------------------------------------------------------------------

    def create_integration(self, account_id: UUID, data: object) -> Integration:
        """Validate and store a connection; raises `InvalidIntegration` listing bad fields."""
        kind, settings, secrets = _validate_integration(data)
        integration = Integration(
            account_id=account_id, id=new_id(), kind=kind, name=settings.pop("name", None),
            settings=settings, secrets=secrets, created_at=self.ledger.clock(),
        )  # fmt: skip
        self.store.create_integration(integration)
        return integration

    # -- automations ---------------------------------------------------------------------

    def create(self, account_id: UUID, data: object) -> AutomationRow:
        """Validate and store an automation."""
        _refuse_sealed_secrets(data)
        now = self.ledger.clock()
        spec = parse_automation(data, now=now)
        definition = spec.to_dict()
        if _named_numbers(definition["steps"]):
            _refuse_unknown_numbers(definition, self._numbers(account_id))
        row = AutomationRow(account_id, new_id(), spec.name, spec.status, spec.metric_name,
                            definition, now, now)  # fmt: skip
        self.store.create_automation(row)
        return row

    def update(self, account_id: UUID, automation_id: UUID, patch: object) -> AutomationRow | None:
        """Apply a partial update (re-validated); None when there is no such automation. A
        change of its steps makes a new version (`version_after`)."""
        _refuse_sealed_secrets(patch)
        patch, in_place = _correction(patch)
        steps = patch.get("steps") if isinstance(patch, Mapping) else None
        # read before the row's lock is taken (SQLite: no read inside its write)
        live = self._numbers(account_id) if _named_numbers(steps) else None

        def change(row: AutomationRow) -> AutomationRow:  # under the row's write lock
            now = self.ledger.clock()
            # as stored: a patch may repair what fails
            spec = apply_patch(row.spec, patch, now=now)
            definition = spec.to_dict()
            if live is not None:
                kept = _named_numbers(row.spec.get("steps")).values()
                _refuse_unknown_numbers(definition, live, kept=set(kept))
            return replace(row, name=spec.name, status=spec.status,
                           trigger_metric=spec.metric_name, spec=definition, updated_at=now,
                           version=version_after(row, definition, in_place=in_place))  # fmt: skip

        return self.store.update_automation(account_id, automation_id, change)

    def trace(self, event: StoredEvent) -> list[dict[str, Any]]:
        """For every automation of the event's account: triggered (with the execution) or why
        not."""
        executions = {  # one per automation at most, all of them: no page
            x.automation_id: x
            for x in self.store.list_executions(event.account_id, event_id=event.id, limit=None)
        }
        withdrawal = cache(lambda: self._withdrawal(event))  # one read, for all of them
        answer = []
        for row in self.store.trace_automations(event.account_id, event.metric_name):
            entry: dict[str, Any] = {"automation_id": str(row.id), "automation_name": row.name}
            entry |= _decision(row, event)
            execution = executions.get(row.id)
            if execution is None and entry["triggered"]:
                # its outbox row went before fan-out: no execution is ever made
                why = withdrawal()
                if why is not None:
                    entry |= {"triggered": False, "outcome": "withdrawn", "message": why}
            if execution is not None:
                if stopped_too_deep(execution):  # matched, but its execution never ran
                    why = execution.last_error
                    entry |= {"triggered": False, "outcome": "chain_too_deep", "message": why}
                elif execution.status == "stopped" and execution.last_error in _WITHDRAWN:
                    why = _STOPPED + execution.last_error
                    entry |= {"triggered": False, "outcome": "withdrawn", "message": why}
                entry["execution"] = execution_summary(execution)
            answer.append(entry)
        return answer

    def _withdrawal(self, event: StoredEvent) -> str | None:
        """Why `event`, a Checkout Abandoned withdrawn from automations before fan-out (by
        its order, `CommerceStore.save_order`, or its integration's delete), made no
        execution; None for any other event."""
        token = event.properties.get("checkout_token")
        if (
            event.metric_name != METRIC_CHECKOUT_ABANDONED
            or not isinstance(token, str)
            or event.unique_event_id != abandonment_id(event.source, token)
        ):
            return None
        if event.properties.get(RECORDED_AFTER_ORDER) is True:
            return _RECORDED_WITH_ORDER
        recovered = self._recovery(event, token)
        if recovered is None:
            return self._disconnection(event)
        ordered_before = recovered.properties.get("ordered_before_abandonment") is True
        return _BEFORE_FAN_OUT + (STOPPED_BY_ORDER if ordered_before else STOPPED_BY_RECOVERY)

    def _disconnection(self, event: StoredEvent) -> str | None:
        """Why a Checkout Abandoned of a deleted integration made no execution (its delete
        took its outbox row); None while the integration is connected."""
        ident = event.integration_id
        if ident is None or self.store.get_integration(event.account_id, ident) is not None:
            return None
        return _BEFORE_FAN_OUT + STOPPED_BY_DISCONNECT

    def _recovery(self, event: StoredEvent, token: str) -> StoredEvent | None:
        """The Checkout Recovered of the Checkout Abandoned `event`, recorded in the
        transaction that withdrew it, never dated before it; None while not recovered.
        Looked up by its unique key: a list of the contact's recoveries since `event`
        (1,000 at most, newest first) missed it behind a thousand later ones."""
        found = self.ledger.find_event(event.account_id, recovery_id(event.source, token))
        is_recovery = (
            found is not None
            and found.metric_name == METRIC_CHECKOUT_RECOVERED
            and found.contact_id == event.contact_id
            and found.occurred_at >= event.occurred_at
        )
        return found if is_recovery else None

    def _numbers(self, account_id: UUID) -> list[str]:
        """The phone_number_id of each of the account's live WhatsApp connections."""
        found = self.store.list_integrations(account_id, "whatsapp")
        return [str(i.settings.get("phone_number_id")) for i in found]


def _decision(row: AutomationRow | AutomationTitle, event: StoredEvent) -> dict[str, Any]:
    """Whether `row` matches `event`, or why not, as the trace says it (before its
    execution is looked at)."""
    if isinstance(row, AutomationTitle):  # as the dispatcher, by its stored trigger alone
        decision = other_metric_decision(row.trigger_metric, event.metric_name)
    else:
        try:
            decision = explain_match(parse_automation(row.spec), event, row.created_at, row.id)
        except InvalidAutomation as exc:  # stored before a check it fails: never runs
            message = f"the automation's definition fails today's checks: {exc}"
            return {"triggered": False, "outcome": "invalid_definition", "message": message}
    return {"triggered": decision.triggered, **decision.as_dict()}


def _named_numbers(steps: object) -> dict[int, str]:
    """The `phone_number_id` each step names, by the step's index, in steps as JSON: a
    definition's (`AutomationSpec.to_dict`, as stored) or a PATCH's."""
    if not isinstance(steps, list):
        return {}
    named = (
        (i, step.get("phone_number_id"))
        for i, step in enumerate(steps)
        if isinstance(step, Mapping)
    )
    return {i: number for i, number in named if isinstance(number, str)}


def _refuse_unknown_numbers(
    definition: Mapping[str, Any], live: Collection[str], kept: Collection[str] = ()
) -> None:
    """`InvalidAutomation` naming each step of `definition` (as JSON) whose
    `phone_number_id` is none of the account's WhatsApp numbers (`live`), nor one the stored
    definition had (`kept`)."""
    shown = ", ".join(sorted(live)) or "none: POST /v1/integrations"
    errors = [
        FieldError(f"steps[{i}].phone_number_id", "unknown_connection",
                   f"{number} is the phone_number_id of none of the account's WhatsApp "
                   f"connections (theirs: {shown})")
        for i, number in _named_numbers(definition["steps"]).items()
        if number not in live and number not in kept
    ]  # fmt: skip
    if errors:
        raise InvalidAutomation(errors)


# A PATCH's flag: its steps correct the current version, for its executions under way too.
CORRECT_IN_PLACE = "correct_in_place"


def version_after(row: AutomationRow, spec: Mapping[str, Any], *, in_place: bool) -> int:
    """The version of `row` (as stored) once its definition is `spec`: the same when its
    steps are, or when they are corrected in place (same number, each step the same type:
    `InvalidAutomation` otherwise); else the next one, and the executions made before keep
    running the steps they were made with (steps are tracked by position: an execution
    waiting at step 2 would otherwise repeat or skip one if a step were put before it or
    taken out). Compared as stored: a webhook secret sent again as text counts as a change."""
    steps, stored = spec.get("steps"), row.spec.get("steps")
    if steps == stored:
        return row.version
    if not in_place:
        return row.version + 1
    if _types(steps) != _types(stored):
        raise InvalidAutomation([FieldError(
            "steps", "not_in_place",
            f"{CORRECT_IN_PLACE} keeps each step's place: the same number of steps, each of "
            "the type it had (a step added, removed or moved makes a new version: send the "
            f"steps without {CORRECT_IN_PLACE})",
        )])  # fmt: skip
    return row.version


def _types(steps: object) -> list[object] | None:
    """The type of each step, in order (None: no list of steps)."""
    if not isinstance(steps, list):
        return None
    return [step.get("type") if isinstance(step, Mapping) else None for step in steps]


def _correction(patch: object) -> tuple[object, bool]:
    """`patch` without `CORRECT_IN_PLACE`, and whether it was true (`InvalidAutomation`
    for a value neither true nor false)."""
    if not isinstance(patch, Mapping) or CORRECT_IN_PLACE not in patch:
        return patch, False
    flag = patch[CORRECT_IN_PLACE]
    if not isinstance(flag, bool):
        raise InvalidAutomation(
            [FieldError(CORRECT_IN_PLACE, "invalid_type", "expected true or false")]
        )
    return {k: v for k, v in patch.items() if k != CORRECT_IN_PLACE}, flag


def _refuse_sealed_secrets(data: object) -> None:
    """`InvalidAutomation` for a webhook step sent with a sealed value as its secret or a
    header's value: the store seals them, and the API shows none, so a client has none to
    send."""
    error = find_sealed_value(data.get("steps")) if isinstance(data, Mapping) else None
    if error is not None:
        raise InvalidAutomation([error])


def automation_view(row: AutomationRow) -> dict[str, Any]:
    """An automation as the API shows it: a webhook step's secret and header values never,
    only that they are set (`SECRET_MASK`, `HEADER_MASK`, which a PATCH may send back to
    keep them)."""
    return {
        "id": str(row.id),
        **redact_secrets(row.spec),
        "resolved_metric": row.trigger_metric,
        "version": row.version,
        "created_at": stamp(row.created_at),
        "updated_at": stamp(row.updated_at),
    }


def integration_view(integration: Integration, base_url: str = "") -> dict[str, Any]:
    """A connection as the API shows it: settings yes, secrets never (only which are set)."""
    view: dict[str, Any] = {
        "id": str(integration.id),
        "kind": integration.kind,
        "name": integration.name,
        **integration.settings,
        "secrets_set": sorted(k for k, v in integration.secrets.items() if v),
        "created_at": stamp(integration.created_at),
    }
    if integration.kind in ("whatsapp", "shopify", "yampi"):
        view["webhook_url"] = f"{base_url}/webhooks/{integration.kind}/{integration.id}"
    return view


def execution_summary(x: Execution) -> dict[str, Any]:
    """An execution without its steps."""
    return {
        "id": str(x.id),
        "automation_id": str(x.automation_id),
        "automation_version": x.automation_version,
        "event_id": str(x.event_id),
        "contact_id": str(x.contact_id),
        "status": x.status,
        "next_step": x.next_step,
        "attempts": x.attempts,
        "run_at": stamp(x.run_at),
        "last_error": x.last_error,
        "created_at": stamp(x.created_at),
        "updated_at": stamp(x.updated_at),
    }


def execution_view(x: Execution, emitted: list[StoredEvent]) -> dict[str, Any]:
    """An execution with its steps, attempts, errors and the events it emitted."""
    return {
        **execution_summary(x),
        "steps": [
            {
                "index": s.step_index, "type": s.step_type, "status": s.status,
                "attempts": s.attempts, "result": s.result, "error": s.error,
                "event_id": None if s.event_id is None else str(s.event_id),
                "started_at": stamp(s.started_at),
                "finished_at": None if s.finished_at is None else stamp(s.finished_at),
            }
            for s in x.steps
        ],
        "emitted_events": [
            {"id": str(e.id), "metric": e.metric_name, "occurred_at": stamp(e.occurred_at)}
            for e in emitted
        ],
    }  # fmt: skip


def _not_text(name: str, value: object) -> FieldError:
    """A setting or secret given as another JSON type: `phone_number_id` as the number
    106540352242922 was answered "phone_number_id is required", as if it had not been sent."""
    is_number = isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**30
    hint = f' (send "{value}", in quotes)' if is_number else ""
    return FieldError(name, "invalid_type", f"{name} must be a string{hint}")


def _validate_integration(data: object) -> tuple[IntegrationKind, dict[str, Any], dict[str, Any]]:
    if not isinstance(data, Mapping):
        raise InvalidIntegration([FieldError("$", "invalid_type", "expected a JSON object")])
    kind = str(data.get("kind"))
    if kind not in get_args(IntegrationKind):
        raise InvalidIntegration(
            [FieldError("kind", "invalid_choice", f"kind must be one of {sorted(_KINDS)}")]
        )
    required, optional, secret_fields = _KINDS[kind]
    errors: list[FieldError] = []
    settings: dict[str, Any] = {}
    for name in required:
        value = data.get(name)
        if value is not None and not isinstance(value, str):  # it was given: say what is wrong
            errors.append(_not_text(name, value))
        elif value is None or not value.strip():
            errors.append(FieldError(name, "required", f"{name} is required for {kind}"))
        else:
            settings[name] = value.strip()
    for name, default in optional.items():
        settings[name] = data.get(name, default)
    for name in _TEXT_SETTINGS:
        text = settings.get(name)
        if text is not None and (not isinstance(text, str) or len(text) > MAX_NAME):
            message = f"{name} must be a string of at most {MAX_NAME} characters"
            errors.append(FieldError(name, "invalid_type", message))
        elif text is not None and not text.strip():  # a blank alias would check nothing
            errors.append(FieldError(name, "empty", f"{name} must not be blank: leave it out"))
    secrets = {name: data.get(name) for name in secret_fields if data.get(name) is not None}
    for name in _REQUIRED_SECRETS.get(kind, ()):
        if secrets.get(name) in (None, ""):  # one of another type is named below
            errors.append(FieldError(name, "required", f"{name} is required for {kind}"))
    for name, value in secrets.items():
        if not isinstance(value, str):
            errors.append(_not_text(name, value))
        elif len(value) > 4096:
            errors.append(FieldError(name, "too_long", f"{name} is longer than 4096 characters"))
        elif name in _BEARER_SECRETS and not value.isascii():  # sent as a header: ASCII
            errors.append(FieldError(name, "invalid_value", f"{name} must be ASCII text"))
    for name in ("api_base_url", "base_url"):
        url = settings.get(name)
        if isinstance(url, str):
            settings[name] = url = url.strip()  # as required settings are
        if url is not None and (problem := _url_problem(name, url)) is not None:
            errors.append(FieldError(name, "invalid_url", problem))
    minutes = settings.get("abandon_after_minutes")
    if minutes is not None and not _is_int_within(minutes, 5, 10_080):
        errors.append(
            FieldError("abandon_after_minutes", "out_of_range",
                       "abandon_after_minutes must be a whole number from 5 to 10080")
        )  # fmt: skip
    for name in ("status_grace_seconds", "order_grace_seconds"):  # see webhooks.deferral_grace
        grace = settings.get(name)
        if grace is not None and not _is_int_within(grace, 0, MAX_GRACE_SECONDS):
            message = f"{name} must be a whole number from 0 to {MAX_GRACE_SECONDS}"
            errors.append(FieldError(name, "out_of_range", message))
    known = dict.fromkeys(["kind", *required, *optional, *secret_fields])
    takes = f"{kind} takes {', '.join(known)}"
    errors += [FieldError(k, "unknown_field", f"unknown field {k!r}; {takes}")
               for k in data if k not in known]  # fmt: skip
    if errors:
        raise InvalidIntegration(errors)
    return cast(IntegrationKind, kind), settings, secrets


def _url_problem(name: str, url: object) -> str | None:
    """Why `url` cannot be the base URL `name` of a connection, or None."""
    if not isinstance(url, str):
        return f"{name} must be an http(s) URL"
    problem = base_url_problem(url, name)
    return None if problem is None else problem.message


def _is_int_within(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
