"""Automations: definitions, matching, message templates and retry delays (the pure core).

The dispatcher and the HTTP API build on these; nothing here does I/O.

```python
spec = parse_automation(request_json)              # InvalidAutomation lists every bad field
decision = explain_match(spec, event, created_at)  # "triggered", or the first reason not
text = render_text(step.text, template_context(event, contact))
delay = next_delay(attempt)                        # exponential backoff, jittered
```

Errors, under `sinal.errors.SinalError`:

```
SinalError
├── InvalidAutomation     # .errors: one FieldError per bad field ("steps[2].text")
└── TemplateSyntaxError   # .code, .position (0-based), .line, .column
```
"""

from __future__ import annotations

from sinal.automations.backoff import RetryPolicy, delay_ceiling, is_exhausted, next_delay
from sinal.automations.matching import (
    ContactData,
    ContactView,
    EventData,
    EventView,
    FilterResult,
    MatchDecision,
    MatchOutcome,
    evaluate_condition,
    evaluate_filters,
    explain_match,
    resolve_trigger_metric,
    template_context,
)
from sinal.automations.model import (
    OPERATORS,
    STEP_TYPES,
    AddTag,
    AiRespond,
    AutomationSpec,
    CloseConversation,
    Condition,
    FilterStep,
    InvalidAutomation,
    Operator,
    RemoveTag,
    SendMessage,
    SendTemplate,
    Status,
    Step,
    Wait,
    Webhook,
    apply_patch,
    parse_automation,
)
from sinal.automations.templates import (
    Template,
    TemplateSyntaxError,
    format_money,
    parse_path,
    parse_template,
    render,
    render_text,
    render_value,
)

__all__ = [
    "OPERATORS",
    "STEP_TYPES",
    "AddTag",
    "AiRespond",
    "AutomationSpec",
    "CloseConversation",
    "Condition",
    "ContactData",
    "ContactView",
    "EventData",
    "EventView",
    "FilterResult",
    "FilterStep",
    "InvalidAutomation",
    "MatchDecision",
    "MatchOutcome",
    "Operator",
    "RemoveTag",
    "RetryPolicy",
    "SendMessage",
    "SendTemplate",
    "Status",
    "Step",
    "Template",
    "TemplateSyntaxError",
    "Wait",
    "Webhook",
    "apply_patch",
    "delay_ceiling",
    "evaluate_condition",
    "evaluate_filters",
    "explain_match",
    "format_money",
    "is_exhausted",
    "next_delay",
    "parse_automation",
    "parse_path",
    "parse_template",
    "render",
    "render_text",
    "render_value",
    "resolve_trigger_metric",
    "template_context",
]
