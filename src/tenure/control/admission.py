"""Admission: turn a client's request into a validated `NewJob`, or refuse it with a clear error.

Nothing is written for a refused request. The idempotency digest is SHA-256 of `tenant|key` (unique per
tenant in the store); the request fingerprint covers everything that defines the job, so replaying a key with a
different request is a conflict, never a second job and never a silent reuse.

`parse_json` is the one reader of JSON text that a client sends (an HTTP body, a WebSocket frame, the CLI's
`--input`): every such text obeys the same rules (strict RFC 8259 JSON, Unicode text, at most `MAX_JSON_DEPTH`
levels of nesting), so a hostile document is refused the same way wherever it arrives.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tenure.contracts.errors import InputTooLarge, InvalidRequest, StoreUnavailable, UnknownAgent
from tenure.contracts.ready import ReadyHint, ReadyIndex
from tenure.contracts.store import Store
from tenure.contracts.types import DEFAULT_TENANT, AgentSpec, Enqueued, NewJob, holds_nul, new_id

MAX_PRIORITY = 100
MAX_KEY_LENGTH = 255
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


def _may_nest_deeper(text: str, limit: int) -> bool:
    # Fewer opening brackets than the limit cannot nest deeper than it: most texts skip the walk (C-speed count).
    return text.count("[") + text.count("{") > limit


def _lone_surrogate(exc: UnicodeEncodeError) -> str:
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
            raise InvalidJSON(f"{what} is not Unicode text: it holds {_lone_surrogate(exc)}") from None
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
    if _may_nest_deeper(text, max_depth) and nesting_exceeds(value, max_depth):
        raise InvalidJSON(f"{what} nests arrays and objects deeper than {max_depth} levels", kind="too-deep")
    if holds_nul(text):
        raise InvalidJSON(f"{what} holds U+0000 (NUL), which a PostgreSQL store cannot hold in text", "nul-character")
    if _SURROGATE_ESCAPE.search(text):
        # Escapes of a valid pair were joined into one character by the decoder; only a lone one fails to encode.
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidJSON(
                f"{what} holds a lone UTF-16 surrogate {_lone_surrogate(exc)}, which is not a Unicode character "
                "(send the character itself, or both halves of its surrogate pair)"
            ) from None
    return value


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """Bounds on what a request may ask for."""

    max_input_bytes: int = 1024 * 1024
    default_deadline_s: float | None = 300.0
    max_deadline_s: float = 7 * 24 * 3600.0
    max_attempts_cap: int = 100


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What a client asks for. Only `agent` and `input` are required."""

    agent: str
    input: Any = None
    priority: int | None = None
    requires: Sequence[str] = ()
    deadline_s: float | None = None
    max_attempts: int | None = None
    idempotency_key: str | None = None
    tenant: str = DEFAULT_TENANT


def idem_digest(tenant: str, key: str) -> bytes:
    """SHA-256 of `tenant|key`: the same key of two tenants never collides."""
    return hashlib.sha256(f"{tenant}|{key}".encode()).digest()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class Admission:
    """Validates requests against the registered agents and limits, then enqueues them."""

    def __init__(
        self,
        store: Store,
        agents: Mapping[str, AgentSpec],
        limits: AdmissionLimits | None = None,
        ready_index: ReadyIndex | None = None,
    ) -> None:
        self.store = store
        self.agents = dict(agents)
        # Optional accelerator: new jobs are hinted to the ready index after the store committed them.
        self.ready_index = ready_index
        self.limits = limits or AdmissionLimits()

    def build(self, req: JobRequest) -> NewJob:
        """Validate one request; raise `InvalidRequest` (or a subclass) with a message a client can act on."""
        spec = self.agents.get(req.agent) if isinstance(req.agent, str) else None
        if spec is None:
            known = ", ".join(sorted(self.agents)) or "none"
            raise UnknownAgent(f"unknown agent {shown(req.agent)} (registered agents: {known})")
        input_json, size = _input_json(req.input)
        if size > self.limits.max_input_bytes:
            raise InputTooLarge(
                f"input is {size} bytes of JSON; the limit is {self.limits.max_input_bytes} bytes "
                "(store large inputs elsewhere and pass a reference)"
            )
        priority = spec.priority if req.priority is None else req.priority
        if not _is_int(priority) or not 0 <= priority <= MAX_PRIORITY:
            raise InvalidRequest(f"priority must be an integer from 0 to {MAX_PRIORITY}, not {shown(priority)}")
        max_attempts = spec.max_attempts if req.max_attempts is None else req.max_attempts
        if not _is_int(max_attempts) or not 1 <= max_attempts <= self.limits.max_attempts_cap:
            raise InvalidRequest(
                f"max_attempts must be an integer from 1 to {self.limits.max_attempts_cap}, not {shown(max_attempts)}"
            )
        deadline_s = self.limits.default_deadline_s if req.deadline_s is None else req.deadline_s
        if deadline_s is not None and (not is_finite_number(deadline_s) or not 0 < deadline_s <= self.limits.max_deadline_s):
            raise InvalidRequest(
                f"deadline_s must be a number of seconds in (0, {self.limits.max_deadline_s:g}], not {shown(deadline_s)}"
            )
        requires = _tags(req.requires) | spec.requires
        if not isinstance(req.tenant, str) or not req.tenant or not _is_text(req.tenant):
            raise InvalidRequest("tenant must be a non-empty string")
        digest = None
        if req.idempotency_key is not None:
            key = req.idempotency_key
            if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH or not _is_text(key):
                raise InvalidRequest(f"an idempotency key is a string of 1 to {MAX_KEY_LENGTH} characters")
            digest = idem_digest(req.tenant, key)
        fingerprint = hashlib.sha256(
            json.dumps([spec.name, input_json, priority, sorted(requires), deadline_s, max_attempts]).encode()
        ).digest()
        return NewJob(
            id=new_id(),
            tenant=req.tenant,
            agent=spec.name,
            input_json=input_json,
            priority=priority,
            requires=tuple(sorted(requires)),
            max_attempts=max_attempts,
            timeout_s=spec.timeout_s,
            retry_safe=spec.retry_safe,
            deadline_s=deadline_s,
            idem_digest=digest,
            request_fingerprint=fingerprint,
        )

    async def submit(self, req: JobRequest) -> Enqueued:
        """Validate and enqueue one job."""
        job = self.build(req)
        (out,) = await self.store.enqueue([job])
        await self.hint([job], [out])
        return out

    async def submit_many(self, reqs: Iterable[JobRequest]) -> list[Enqueued]:
        """Validate every request first (all or nothing), then enqueue them in one batch."""
        jobs = [self.build(r) for r in reqs]
        out = await self.store.enqueue(jobs)
        await self.hint(jobs, out)
        return out

    async def hint(self, jobs: list[NewJob], enqueued: list[Enqueued]) -> None:
        """Publish ready hints for the jobs created now. The index is an accelerator: if it is down, workers
        find the jobs by polling the store, so a failure here is logged, never raised."""
        if self.ready_index is None:
            return
        created = {e.job_id for e in enqueued if e.created}
        hints = [ReadyHint(j.id, j.agent, j.priority) for j in jobs if j.id in created]
        try:
            await self.ready_index.publish(hints)
        except StoreUnavailable as exc:
            logging.getLogger("tenure.admission").warning("ready index unavailable, workers will poll: %s", exc)


def shown(value: Any, limit: int = 60) -> str:
    """`repr` of a client's value for an error message, cut to `limit` characters: a problem body quotes what
    was wrong, never the whole megabyte of it."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit has no repr
        text = "<an integer too large to print>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_finite_number(v: Any) -> bool:
    """An int or a finite float, not a bool. An int is finite however large (`math.isfinite` would overflow)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return isinstance(v, int) or math.isfinite(v)


def _is_text(s: str) -> bool:
    """Whether `s` encodes as UTF-8: a lone surrogate cannot be hashed, stored or sent back."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _input_json(value: Any) -> tuple[str, int]:
    """A job's input as stored (compact JSON) and its size in bytes, or `InvalidJSON` / `InvalidRequest`.
    Values from Python callers are held to the rules `parse_json` enforces on texts."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:  # a ValueError too: test it first
        raise InvalidJSON(
            f"input holds a lone UTF-16 surrogate {_lone_surrogate(exc)}, which is not a Unicode character"
        ) from None
    except RecursionError:
        raise InvalidJSON(f"input nests arrays and objects deeper than {MAX_JSON_DEPTH} levels", kind="too-deep") from None
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"input is not JSON-serializable: {exc}") from exc
    if holds_nul(text):
        raise InvalidJSON("input holds U+0000 (NUL), which a PostgreSQL store cannot hold in text", "nul-character")
    # Decoded again (only when it has enough brackets to be too deep): tuples, dict subclasses and the like
    # from Python callers are then walked exactly as the JSON the store will hold.
    if _may_nest_deeper(text, MAX_JSON_DEPTH) and nesting_exceeds(json.loads(text), MAX_JSON_DEPTH):
        raise InvalidJSON(f"input nests arrays and objects deeper than {MAX_JSON_DEPTH} levels", kind="too-deep")
    return text, size


def _tags(tags: Iterable[str]) -> frozenset[str]:
    out = set()
    if isinstance(tags, str):
        raise InvalidRequest("requires must be a list of capability tags, not a string")
    for t in tags:
        if not isinstance(t, str) or not re.fullmatch(r"[A-Za-z0-9_.:/-]{1,64}", t):
            raise InvalidRequest(f"{shown(t)} is not a valid capability tag (letters, digits, _.:/-, 1-64 chars)")
        out.add(t)
    return frozenset(out)
