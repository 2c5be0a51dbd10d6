"""The answers of the automation routes (integrations, automations, executions, traces),
as the OpenAPI document shows them.

The routes build these answers as dicts (`sinal.automations.service`) and send them as
orjson wrote them: FastAPI neither validates nor re-serializes a `Response` a route
returns, so these models describe the bytes and never change them. A field declared with
`_absent` is left out of an answer when it has no value (it is never null).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, RootModel, WithJsonSchema

from sinal.api.models import Stamp
from sinal.automations.matching import MatchOutcome
from sinal.automations.model import Operator, Status
from sinal.store.automations import ExecutionStatus, StepStatus

_SCALAR: list[dict[str, Any]] = [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def _absent(description: str | None = None) -> Any:
    """A field that is left out of the answer when it has no value (never null)."""
    return Field(None, description=description, json_schema_extra=_no_default)


# -- integrations ------------------------------------------------------------------------


class _IntegrationOut(BaseModel):
    id: str
    name: str | None
    secrets_set: list[str] = Field(description="The secrets set (their values are never shown)")
    created_at: Stamp


class _ReceivingIntegration(_IntegrationOut):
    webhook_url: str = Field(
        description="Where the provider delivers: on SINAL_PUBLIC_URL when set, else on the "
        "URL of the request that answered"
    )


# Settings with a default are left out by connections made before the setting existed.
class WhatsAppIntegrationOut(_ReceivingIntegration):
    """A WhatsApp Cloud API connection."""

    kind: Literal["whatsapp"]
    phone_number_id: str
    api_base_url: str | None = None
    status_grace_seconds: int | None = None


class AiIntegrationOut(_IntegrationOut):
    """An AI endpoint (OpenAI-compatible) for `ai_respond` steps."""

    kind: Literal["ai"]
    base_url: str
    model: str


class ShopifyIntegrationOut(_ReceivingIntegration):
    """A Shopify store."""

    kind: Literal["shopify"]
    abandon_after_minutes: int | None = None
    order_grace_seconds: int | None = None
    shop_domain: str | None = None


class YampiIntegrationOut(_ReceivingIntegration):
    """A Yampi store."""

    kind: Literal["yampi"]
    alias: str | None = None


class IntegrationOut(
    RootModel[
        Annotated[
            WhatsAppIntegrationOut | AiIntegrationOut | ShopifyIntegrationOut | YampiIntegrationOut,
            Field(discriminator="kind"),
        ]
    ]
):
    """A connection, by its kind: its settings, never its secrets (only which are set)."""


class IntegrationList(BaseModel):
    """The account's integrations, oldest first; pass `next_cursor` as `cursor` for the
    next page (null on the last)."""

    data: list[IntegrationOut]
    next_cursor: str | None


# -- automations -------------------------------------------------------------------------


class ConditionOut(BaseModel):
    """One condition: `field` `op` `value`."""

    field: str
    op: Operator
    value: Annotated[
        Any,
        WithJsonSchema(
            {
                "anyOf": [*_SCALAR, {"type": "array", "items": {"anyOf": _SCALAR}}],
                "description": "A list for `in`, true or false for `exists`",
            }
        ),
    ]


class SendMessageStep(BaseModel):
    """Send a WhatsApp text."""

    type: Literal["send_message"]
    text: str
    track_links: bool = _absent("Present (true) when the text's URLs are tracked")
    campaign: str = _absent("With track_links: the links' campaign, if not the automation's")
    phone_number_id: str = _absent(
        "The WhatsApp number to send from to a contact who has written to none of the "
        "account's numbers (one of its connections' phone_number_id)"
    )


class SendTemplateStep(BaseModel):
    """Send an approved WhatsApp template."""

    type: Literal["send_template"]
    name: str
    language: str
    parameters: list[str] = _absent()
    components: list[dict[str, Any]] = _absent()
    track_links: bool = _absent("Present (true) when the parameters' URLs are tracked")
    campaign: str = _absent("With track_links: the links' campaign, if not the automation's")
    phone_number_id: str = _absent(
        "The WhatsApp number to send from to a contact who has written to none of the "
        "account's numbers (one of its connections' phone_number_id)"
    )


class AddTagStep(BaseModel):
    """Add a tag to the contact."""

    type: Literal["add_tag"]
    tag: str


class RemoveTagStep(BaseModel):
    """Remove a tag from the contact."""

    type: Literal["remove_tag"]
    tag: str


class CloseConversationStep(BaseModel):
    """Close the contact's open conversation."""

    type: Literal["close_conversation"]


class AiRespondStep(BaseModel):
    """Ask the account's AI connection for an answer and send it."""

    type: Literal["ai_respond"]
    system_prompt: str = _absent()
    prompt: str = _absent()
    max_tokens: int = _absent()
    track_links: bool = _absent("Present (true) when the answer's URLs are tracked")
    campaign: str = _absent("With track_links: the links' campaign, if not the automation's")
    phone_number_id: str = _absent(
        "The WhatsApp number to send from to a contact who has written to none of the "
        "account's numbers (one of its connections' phone_number_id)"
    )


class WebhookStep(BaseModel):
    """POST the event as JSON to `url`."""

    type: Literal["webhook"]
    url: str
    headers: dict[str, Literal["********"]] = _absent(
        "The header names: their values are never shown (HEADER_MASK)"
    )
    secret: Literal["whsec_********"] = _absent(
        "Present when the requests are signed: the secret is never shown (SECRET_MASK)"
    )


class WaitStep(BaseModel):
    """Resume after `seconds`, or at `until` (one of them is present; `until` is ahead when
    saved)."""

    type: Literal["wait"]
    seconds: int = _absent()
    until: Stamp = _absent()


class FilterStep(BaseModel):
    """Stop the execution unless every condition holds."""

    type: Literal["filter"]
    conditions: list[ConditionOut]


StepOut = Annotated[
    SendMessageStep | SendTemplateStep | AddTagStep | RemoveTagStep | CloseConversationStep
    | AiRespondStep | WebhookStep | WaitStep | FilterStep,
    Field(discriminator="type"),
]  # fmt: skip


class AutomationOut(BaseModel):
    """An automation: one of `trigger_metric` and `trigger_type` is present."""

    id: str
    name: str
    status: Status
    trigger_metric: str = _absent()
    trigger_type: str = _absent()
    filters: list[ConditionOut]
    steps: list[StepOut]
    resolved_metric: str = Field(description="The metric it listens to")
    version: int = Field(
        description="1 when created, one more with each change of its steps: executions run "
        "the version they were made with"
    )
    created_at: Stamp
    updated_at: Stamp


class AutomationList(BaseModel):
    """The account's automations, oldest first; pass `next_cursor` as `cursor` for the
    next page (null on the last)."""

    data: list[AutomationOut]
    next_cursor: str | None


# -- executions and traces ---------------------------------------------------------------


class ExecutionOut(BaseModel):
    """One run of an automation for one event."""

    id: str
    automation_id: str
    automation_version: int = Field(
        description="The version of its automation's steps it runs: the one it was made with"
    )
    event_id: str
    contact_id: str
    status: ExecutionStatus
    next_step: int = Field(description="The index of the step to run next")
    attempts: int
    run_at: Stamp
    last_error: str | None
    created_at: Stamp
    updated_at: Stamp


class ExecutionList(BaseModel):
    """An automation's executions, newest first; pass `next_cursor` as `cursor` for the
    next page (null on the last)."""

    data: list[ExecutionOut]
    next_cursor: str | None


class StepRecordOut(BaseModel):
    """What happened to one step."""

    index: int
    type: str
    status: StepStatus
    attempts: int
    result: dict[str, Any] | None
    error: str | None
    event_id: str | None = Field(description="The event the step emitted")
    started_at: Stamp
    finished_at: Stamp | None


class EmittedEventOut(BaseModel):
    """An event an execution's steps emitted."""

    id: str
    metric: str
    occurred_at: Stamp


class ExecutionDetail(ExecutionOut):
    """An execution with its steps and the events they emitted (oldest first)."""

    steps: list[StepRecordOut]
    emitted_events: list[EmittedEventOut] = Field(
        description="The newest 1,000 at most, oldest first (a step emits one at most)"
    )
    emitted_events_truncated: bool = Field(
        description="Whether more events name the execution than emitted_events lists: "
        "only events a library caller tagged with it can pass 1,000"
    )


class TraceEntry(BaseModel):
    """One automation: triggered (with its execution) or the first reason it was not."""

    automation_id: str
    automation_name: str
    triggered: bool
    outcome: Literal[MatchOutcome, "invalid_definition", "chain_too_deep", "withdrawn"]
    message: str
    filter_index: int = _absent("With filter_false: the index of the filter that is false")
    filter_field: str = _absent("With filter_false: that filter's field")
    execution: ExecutionOut = _absent("The execution made for the event, if any")


class TraceOut(BaseModel):
    """For every automation of the account, whether the event triggered it."""

    event_id: str
    automations: list[TraceEntry]
