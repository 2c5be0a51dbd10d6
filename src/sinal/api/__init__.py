"""sinal's HTTP service: `create_app(settings) -> FastAPI`.

```
api/
  app.py        create_app: lifespan (ledger, group commit), middleware, error handlers
  routes/       events, contacts, analytics (metrics, aggregates), rejections, system,
                automations
  fast_path.py  POST /v1/events without the framework's per-request machinery
  body.py       strict JSON bodies: size caps, media type, duplicate keys, NaN, surrogates
  errors.py     the one table from exceptions to problem+json answers
  models.py     request and answer shapes (the OpenAPI schema)
  service.py    what requests share: ledger, group committer, API key cache
  metrics.py    Prometheus collectors and the timing middleware
```
"""

from __future__ import annotations

from sinal.api.app import create_app, create_app_from_env

__all__ = ["create_app", "create_app_from_env"]
