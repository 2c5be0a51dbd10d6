"""Reading a JSON body strictly: size-capped, declared as uncompressed JSON, every oddity
named.

The standard library's parser is asked to report what lenient parsers let through —
duplicate keys (`object_pairs_hook`), `NaN`/`Infinity` (`parse_constant`) — and the tree
is then walked once to name each bad spot by its JSON path: duplicate keys, non-finite
numbers, lone UTF-16 surrogates and NUL characters, in keys and values alike. Numbers
with a fraction are read as exact decimals where a decimal is expected (`value`) and as
floats elsewhere.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from sinal.api.errors import (
    InvalidInput,
    MalformedBody,
    PayloadTooLarge,
    UnsupportedMediaType,
    pydantic_errors,
)
from sinal.errors import FieldError

MAX_ERRORS = 50  # reported per body; past this the answer says "and more"
MAX_NESTING = 64  # deeper bodies are refused before the parser recurses


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its key/value pairs, in order, duplicates kept."""


class _NonFinite:
    """Where the body said NaN, Infinity or -Infinity."""

    def __init__(self, text: str) -> None:
        self.text = text


_VALUE_PATH = re.compile(r"(events\[\d+\]\.)?value")
# NUL or any UTF-16 surrogate escape: the careful walk decides (pairs are fine, lone
# surrogates are not). Raw control characters and invalid UTF-8 never parse at all.
_SUSPECT = re.compile(r"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")
_SLOW = object()
_CHARSET = re.compile(r"charset\s*=\s*\"?([\w-]+)", re.IGNORECASE)


def is_value_path(path: str) -> bool:
    """`value`, top-level or in a batch item: the fields read as exact decimals."""
    return _VALUE_PATH.fullmatch(path) is not None


async def read_json(request: Request, limit: int) -> Any:
    """The request's JSON body as plain Python data, or the API error that explains why not."""
    _check_media_type(request.headers.get("content-type"))
    _check_encoding(request.headers.get("content-encoding"))
    raw = await _read_capped(request, limit)
    return parse_json(raw)


async def read_raw(request: Request, limit: int) -> bytes:
    """The body's bytes exactly as sent (webhook signatures cover them), size-capped."""
    return await _read_capped(request, limit)


def parse_json(raw: bytes) -> Any:
    """Parse and check `raw` (see the module docstring)."""
    if not raw.strip():
        raise MalformedBody("the body is empty; send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedBody(f"the body is not valid UTF-8 (byte {exc.start})") from None
    if _SUSPECT.search(text) is None:
        data = _parse_fast(text)
        if data is not _SLOW:
            return data
    return _parse_checked(text)


def _parse_fast(text: str) -> Any:
    """The common case, at C speed: plain dicts (duplicates only noticed), floats only
    converted where there are any. `_SLOW` when the careful walk must name a problem."""
    seen = {"odd": False, "floats": False}

    def obj(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) != len(pairs):
            seen["odd"] = True
        return out

    def constant(_: str) -> None:
        seen["odd"] = True

    def number(literal: str) -> Decimal:
        seen["floats"] = True
        return Decimal(literal)

    tree = _loads(text, obj, constant, number)
    if seen["odd"]:
        return _SLOW
    if not seen["floats"]:
        return tree
    try:
        return _with_floats(tree)
    except _NeedsWalk:
        return _SLOW


def _parse_checked(text: str) -> Any:
    """Parse keeping every key and constant, then name each bad spot by its path."""
    tree = _loads(text, _Pairs, _NonFinite, Decimal)
    walker = _Walker()
    data = walker.walk(tree, "", 0)
    if walker.errors:
        errors = walker.errors[:MAX_ERRORS]
        raise InvalidInput("; ".join(f"{e.field or 'body'}: {e.message}" for e in errors[:5]),
                           errors)  # fmt: skip
    return data


def _loads(text: str, obj: Any, constant: Any, number: Any) -> Any:
    try:
        return json.loads(text, object_pairs_hook=obj, parse_constant=constant,
                          parse_float=number)  # fmt: skip
    except json.JSONDecodeError as exc:
        raise MalformedBody(f"the body is not valid JSON: {exc.msg} at line {exc.lineno}, "
                            f"column {exc.colno}") from None  # fmt: skip
    except RecursionError:
        raise _too_deep("body") from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise MalformedBody(f"the body is not valid JSON: {exc}") from None


class _NeedsWalk(Exception):
    """The fast path met something only the careful walk can report."""


def _with_floats(tree: Any) -> Any:
    """Numbers with a fraction as floats, except `value` (top level or a batch item's)."""
    if not isinstance(tree, dict):
        return _floats(tree, 0)
    events = tree.get("events")
    # A batch's items are converted below, each keeping its `value`: converting them here
    # too would turn those values into floats first.
    is_batch = isinstance(events, list)
    out = {
        k: v if k == "value" or (is_batch and k == "events") else _floats(v, 1)
        for k, v in tree.items()
    }
    if isinstance(events, list):
        out["events"] = [
            {k: v if k == "value" else _floats(v, 3) for k, v in item.items()}
            if isinstance(item, dict)
            else _floats(item, 2)
            for item in events
        ]
    return out


def _floats(node: Any, depth: int) -> Any:
    if isinstance(node, Decimal):
        number = float(node)
        if math.isinf(number):
            raise _NeedsWalk
        return number
    if depth >= MAX_NESTING and isinstance(node, dict | list):
        raise _NeedsWalk
    if isinstance(node, dict):
        return {k: _floats(v, depth + 1) for k, v in node.items()}
    if isinstance(node, list):
        return [_floats(v, depth + 1) for v in node]
    return node


def _check_media_type(header: str | None) -> None:
    media, _, params = (header or "").partition(";")
    media = media.strip().lower()
    is_json = media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )
    if not is_json:
        shown = media or "no Content-Type"
        raise UnsupportedMediaType(f"send the body as application/json (got {shown})")
    charset = _CHARSET.search(params)
    if charset and charset.group(1).lower() not in ("utf-8", "utf8"):
        raise UnsupportedMediaType(f"JSON must be UTF-8 (got charset {charset.group(1)})")


def _check_encoding(header: str | None) -> None:
    """Only an uncompressed body is read: a gzip one was answered "not valid UTF-8 (byte
    1)", and one that said `br` but was plain was read as if it had not said so."""
    given = (header or "").strip()
    if given.lower() not in ("", "identity"):
        raise UnsupportedMediaType(
            f"send the body uncompressed: Content-Encoding {given} is not supported"
        )


async def _read_capped(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the body has {int(declared):,} bytes; the limit is {limit:,}")
    chunks: list[bytes] = []
    size = 0
    more = True
    # The ASGI messages read directly, as `request.stream()` reads them: an async
    # generator cost the single-event route ~5% of its CPU (frames, asyncgen hooks).
    while more:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        if message["type"] != "http.request":
            continue
        chunk = message.get("body", b"")
        more = message.get("more_body", False)
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the body is over the limit of {limit:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _printable(text: str) -> str:
    """`text` with lone surrogates escaped, so a field path can be sent back as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _too_deep(path: str) -> InvalidInput:
    message = f"JSON nests deeper than {MAX_NESTING} levels"
    return InvalidInput(message, [FieldError(path or "body", "too_deep", message)])


class _Walker:
    """Turns the parsed tree into plain data, collecting one error per bad spot."""

    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def fail(self, path: str, code: str, message: str) -> None:
        self.errors.append(FieldError(path or "body", code, message))

    def walk(self, node: Any, path: str, depth: int) -> Any:
        if isinstance(node, _Pairs | list) and depth >= MAX_NESTING:
            self.errors.append(_too_deep(path).errors[0])
            return None
        if isinstance(node, _Pairs):
            return self.walk_object(node, path, depth + 1)
        if isinstance(node, list):
            return [self.walk(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(node)]
        if isinstance(node, str):
            self.check_text(node, path, "a string")
            return node
        if isinstance(node, Decimal):
            return self.number(node, path)
        if isinstance(node, _NonFinite):
            self.fail(path, "not_finite", f"{node.text} is not a JSON number; numbers are finite")
            return None
        return node  # int, bool, None

    def walk_object(self, pairs: _Pairs, path: str, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            name = _printable(key)
            child = f"{path}.{name}" if path else name
            if key in out:
                self.fail(child, "duplicate_key", f"the key {key!r} appears more than once")
                continue
            self.check_text(key, child, "the key")
            out[key] = self.walk(value, child, depth)
        return out

    def check_text(self, text: str, path: str, what: str) -> None:
        if "\x00" in text:
            self.fail(path, "nul_character", f"{what} contains a NUL character (\\u0000)")
            return
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # only a lone surrogate cannot be encoded
            self.fail(path, "lone_surrogate", f"{what} contains a lone UTF-16 surrogate")

    def number(self, number: Decimal, path: str) -> Decimal | float | None:
        if is_value_path(path):
            return number
        as_float = float(number)
        if math.isinf(as_float):
            self.fail(path, "out_of_range", "the number is too large for a 64-bit float")
            return None
        return as_float


ModelT = TypeVar("ModelT", bound=BaseModel)


def validate(model: type[ModelT], data: Any, prefix: str = "") -> ModelT:
    """`model` from parsed JSON, or `InvalidInput` with one entry per bad field (an
    unknown field's names the fields its object takes)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        found = exc.errors(include_url=False)  # inputs: only their JSON type is named
        errors = pydantic_errors(found, prefix=prefix, model=model)
        detail = "; ".join(f"{e.field}: {e.message}" for e in errors[:5])
        raise InvalidInput(detail, errors) from None
