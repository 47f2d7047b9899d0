"""JSON and text that every store can hold: one encoding for inputs, results and payloads (`dumps`), and error
text made safe for any store's text column (`clean_text`, `describe_error`)."""

from __future__ import annotations

import json
import re
from typing import Any


def dumps(value: Any) -> str:
    """Compact JSON, the one encoding used for inputs, results and payloads.

    Only JSON that every store accepts: no NaN or infinities (`ValueError`), and no lone surrogate
    (`"\\ud800"` is a Python string but not UTF-8, and PostgreSQL refuses it). Raising here, in the caller's
    own call (`ctx.emit`, a handler's return), keeps a value no store can hold from reaching a batched write."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    if holds_nul(text):
        raise ValueError("this value cannot be stored: it holds U+0000 (NUL), which PostgreSQL cannot hold in text")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"this value cannot be stored as UTF-8 JSON: it holds a lone surrogate ({text[exc.start]!r} at "
                f"character {exc.start} of its JSON text)"
            ) from None
    return text


_SURROGATES = re.compile("[\ud800-\udfff]")
# A `\u0000` escape that is not the tail of an escaped backslash (`\\u0000` is the text "\u0000"): exact on JSON
# text, where a backslash only occurs in strings and strict JSON has no raw control characters.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def holds_nul(json_text: str) -> bool:
    """Whether JSON text holds U+0000 in a string or key: PostgreSQL's text and json functions refuse it, so no
    store takes it (the same rule for every backend)."""
    return "\\u0000" in json_text and _NUL_ESCAPE.search(json_text) is not None


def clean_text(text: str, limit: int = 4000) -> str:
    """`text` made safe for any store's text column and short enough to read: NUL characters removed, lone
    surrogates replaced by U+FFFD, and at most `limit` characters (the cut is said)."""
    if not text.isascii():
        text = _SURROGATES.sub("\ufffd", text)
    text = text.replace("\x00", "")
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text) - limit} more characters)"
    return text


def describe_error(exc: BaseException, limit: int = 4000) -> str:
    """`Type: message` of an exception for a job's error, never raising: an exception whose `str()` raises is
    described by its type alone, and the text is `clean_text`."""
    try:
        name = type(exc).__name__
    except Exception:  # a hostile metaclass
        name = "Exception"
    try:
        text = str(exc)
    except Exception as failure:
        try:
            text = f"(its str() raised {type(failure).__name__})"
        except Exception:
            text = "(its str() raised)"
    return clean_text(f"{name}: {text}" if text else name, limit)
