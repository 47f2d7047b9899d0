"""The one strict JSON reader of every door (HTTP bodies, WebSocket frames, CLI input): UTF-8 only, no lone
surrogates, no NaN or infinities, numbers in range, and a documented nesting limit (`MAX_JSON_DEPTH`), each
refused as `InvalidJSON` (a 400 problem, a one-paragraph CLI error) before anything is written."""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

from tenure.contracts.errors import InvalidRequest
from tenure.contracts.text import holds_nul

MAX_JSON_DEPTH = 64
"""How deeply a job's input, or any other JSON value a client sends, may nest arrays and objects. A request body
or WebSocket frame wraps its values in one object, so the text itself may nest `MAX_JSON_DEPTH + 1` levels. Python
gives up on JSON near its recursion limit (1,000 frames; a 50,000-deep body of 100 KB reached it), and a job
nested a few hundred levels deep could be stored but no longer rendered: the limit keeps every stored value far
from both, and is large for any real input."""
ENVELOPE_DEPTH = MAX_JSON_DEPTH + 1
"""The nesting limit of a request body or a WebSocket frame: its own object, then values of `MAX_JSON_DEPTH`."""

# A `\uD800`-`\uDFFF` escape: the only way a lone surrogate gets into a decoded str from strict UTF-8 text.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_CONTAINERS = {list, dict}  # what json.loads builds; exact types, so the walk needs no isinstance per element


class InvalidJSON(InvalidRequest):
    """The text is not JSON the runtime accepts (the HTTP API answers 400 with `kind` as the problem type, the
    CLI `invalid_request`):

        bad-json        a syntax error, a NaN or Infinity literal, a number out of range, bytes that are not
                        UTF-8, a lone UTF-16 surrogate (not a Unicode character: it cannot be stored or sent back)
        too-deep        arrays and objects nested deeper than the limit
        nul-character   U+0000 in a string or key: PostgreSQL cannot hold it in text, so no store takes it
    """

    TITLES = {"bad-json": "Malformed JSON", "too-deep": "JSON nested too deep", "nul-character": "NUL character"}

    def __init__(self, message: str, kind: str = "bad-json") -> None:
        super().__init__(message)
        self.kind = kind
        self.title = self.TITLES[kind]


class _Refused(ValueError):
    """Raised by the decoder's hooks; carries the reason, told apart from the decoder's own errors."""


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number (RFC 8259 has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:40]} is out of range (beyond a 64-bit float)")
    return value


def nesting_exceeds(value: Any, limit: int) -> bool:
    """Whether a decoded JSON value nests arrays and objects deeper than `limit` levels (`[]` is one level).
    Level by level, without recursion: the depth of what it walks is what it is there to bound."""
    level = [value] if type(value) in _CONTAINERS else []
    depth = 1
    while level:
        if depth > limit:
            return True
        below: list[Any] = []
        for v in level:
            below += [c for c in (v.values() if type(v) is dict else v) if type(c) in _CONTAINERS]
        level = below
        depth += 1
    return False


def may_nest_deeper(text: str, limit: int) -> bool:
    # Fewer opening brackets than the limit cannot nest deeper than it: most texts skip the walk (C-speed count).
    return text.count("[") + text.count("{") > limit


def lone_surrogate(exc: UnicodeEncodeError) -> str:
    return f"\\u{ord(exc.object[exc.start]):04x}"


def parse_json(data: str | bytes, what: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Decode one JSON text a client sent, or raise `InvalidJSON` with a message naming `what` ("the body",
    "--input", ...). Strict: UTF-8 (or the UTF-16/32 that `json.loads` detects in bytes), no NaN or Infinity, finite
    numbers, no lone surrogates anywhere (values, keys), at most `max_depth` levels of nesting."""
    if isinstance(data, bytes):
        try:
            text = data.decode(json.detect_encoding(data))
        except UnicodeDecodeError as exc:
            raise InvalidJSON(f"{what} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    else:
        text = data
        try:
            text.encode("utf-8")  # a str from argv or a file read with surrogateescape may hold raw surrogates
        except UnicodeEncodeError as exc:
            raise InvalidJSON(f"{what} is not Unicode text: it holds {lone_surrogate(exc)}") from None
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise InvalidJSON(f"{what} nests arrays and objects deeper than {max_depth} levels", kind="too-deep") from None
    except json.JSONDecodeError as exc:
        raise InvalidJSON(f"{what} is not valid JSON: {exc}") from None
    except _Refused as exc:
        raise InvalidJSON(f"{what} is not valid JSON: {exc}") from None
    except ValueError:  # the only other one: an integer literal over Python's digit limit
        raise InvalidJSON(
            f"{what} is not valid JSON here: an integer has more than {sys.get_int_max_str_digits()} digits"
        ) from None
    if may_nest_deeper(text, max_depth) and nesting_exceeds(value, max_depth):
        raise InvalidJSON(f"{what} nests arrays and objects deeper than {max_depth} levels", kind="too-deep")
    if holds_nul(text):
        raise InvalidJSON(f"{what} holds U+0000 (NUL), which a PostgreSQL store cannot hold in text", "nul-character")
    if _SURROGATE_ESCAPE.search(text):
        # Escapes of a valid pair were joined into one character by the decoder; only a lone one fails to encode.
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidJSON(
                f"{what} holds a lone UTF-16 surrogate {lone_surrogate(exc)}, which is not a Unicode character "
                "(send the character itself, or both halves of its surrogate pair)"
            ) from None
    return value
