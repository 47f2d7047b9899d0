"""The dashboard's sessions: an API key entered once per browser session, kept in a signed cookie.

The login form takes a key the gateway knows (`TENURE_API_KEYS`, `TENURE_ADMIN_KEY`); the answer sets the cookie
`tenure_session`: HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it), Secure over
HTTPS, `Path=/`, expiring after `TENURE_UI_SESSION_S` (8 h) both in the browser and in its signature (itsdangerous,
keyed by `TENURE_UI_SECRET`). It never holds the key: only `HMAC(secret, SHA-256(key))`, which names the key
without revealing it, so a session ends when its key is removed from the configuration, and a CSRF token.

What a session is good for: the dashboard's pages, and the HTTP API called *from those pages* — a request
authenticated by the cookie must come from the gateway's own origin (its `Origin`, when the browser sends one,
is the gateway's), and a request that changes something (any method but GET and HEAD) must carry the session's
CSRF token in `X-Tenure-CSRF`. Other origins call the API with a key (`Authorization`, or `?access_token=` on
streams), as allowed by CORS. SameSite does not separate ports (`localhost:3000` is the same site as
`localhost:8000`), which is why the origin and the token are checked as well.

Logout clears the cookie in this browser. The cookie is stateless — nothing is stored in the gateway, so any
number of gateways sharing `TENURE_UI_SECRET` accept it — and a copy taken before the logout stays valid until
it expires; rotate `TENURE_UI_SECRET` (or remove the key) to end every session at once. Without
`TENURE_UI_SECRET` each gateway process draws its own secret: sessions end when it restarts and are not shared
between replicas.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import HTTPConnection
from starlette.responses import Response

from tenure.contracts.errors import ConfigError
from tenure.gateway.auth import Auth, Principal

COOKIE = "tenure_session"
CSRF_HEADER = "x-tenure-csrf"
SAFE_METHODS = frozenset({"GET", "HEAD"})
DEFAULT_SESSION_S = 8 * 3600


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in browser: who it is, and the token its pages send with every change."""

    principal: Principal
    csrf: str


def parse_secret(text: str | None) -> bytes:
    """`TENURE_UI_SECRET`, at least 32 characters; unset: a random secret for this process only."""
    if text is None or not text.strip():
        return os.urandom(32)
    if len(text.strip()) < 32:
        raise ConfigError("TENURE_UI_SECRET needs at least 32 characters (it signs the dashboard's session cookies)")
    return text.strip().encode()


def parse_session_s(text: str | None) -> int:
    """`TENURE_UI_SESSION_S`: how long a dashboard session lasts, in whole seconds (default 8 h)."""
    if text is None or not text.strip():
        return DEFAULT_SESSION_S
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"TENURE_UI_SESSION_S must be a whole number of seconds, not {text!r}") from None
    if not 60 <= value <= 30 * 86400:
        raise ConfigError(f"TENURE_UI_SESSION_S must be from 60 s to 30 days, not {value}")
    return value


class Sessions:
    """Issues and checks session cookies for one gateway's key table."""

    def __init__(self, auth: Auth, secret: bytes, max_age_s: int = DEFAULT_SESSION_S) -> None:
        self.auth = auth
        self.max_age_s = max_age_s
        self._secret = secret
        self._signer = URLSafeTimedSerializer(secret, salt="tenure.ui.session")
        self._keys = {self._kid(d): p for d, p in auth.principals()}
        # An open gateway (no keys) has no login: every browser is tenant `default`, and changes still need a
        # token, so a page of another origin cannot start a lab or cancel a job by posting a form.
        self._open_csrf = hmac.new(secret, b"open", hashlib.sha256).hexdigest()

    @property
    def open(self) -> bool:
        """No key is configured: no login, every request is tenant `default` (a loopback gateway)."""
        return not self.auth.enabled

    def _kid(self, digest: bytes) -> str:
        return hmac.new(self._secret, digest, hashlib.sha256).hexdigest()[:32]

    def login(self, key: str) -> str | None:
        """The cookie value of a new session for `key`, or None when the gateway does not know the key."""
        found = self.auth.authenticate_key(key)
        if found is None:
            return None
        return self._signer.dumps({"k": self._kid(found[1]), "c": secrets.token_urlsafe(24)})

    def read(self, conn: HTTPConnection) -> Session | None:
        """The session of this request's cookie: signed by us, not expired, for a key still configured."""
        if self.open:
            return Session(Principal("default"), self._open_csrf)
        value = conn.cookies.get(COOKIE)
        if not value:
            return None
        try:
            data = self._signer.loads(value, max_age=self.max_age_s)
        except BadSignature:  # SignatureExpired is one
            return None
        if not isinstance(data, dict) or not isinstance(data.get("k"), str) or not isinstance(data.get("c"), str):
            return None
        principal = self._keys.get(data["k"])
        return None if principal is None else Session(principal, data["c"])

    def same_origin(self, conn: HTTPConnection) -> bool:
        """Whether the browser says this request comes from the gateway's own origin (or says nothing)."""
        fetch_site = conn.headers.get("sec-fetch-site")
        if fetch_site is not None and fetch_site not in ("same-origin", "none"):
            return False
        origin = conn.headers.get("origin")
        if origin is None:
            return True
        return origin.rstrip("/").lower() == f"{conn.url.scheme}://{conn.url.netloc}".lower()

    def principal(self, conn: HTTPConnection, method: str = "GET") -> Principal | None:
        """The caller of a request authenticated by its session cookie: same origin, and for a change the CSRF
        token in `X-Tenure-CSRF`; None otherwise (the request then needs a key)."""
        if not self.same_origin(conn):
            return None
        session = self.read(conn)
        if session is None:
            return None
        if method.upper() not in SAFE_METHODS and not hmac.compare_digest(conn.headers.get(CSRF_HEADER, ""), session.csrf):
            return None
        return session.principal

    def set_cookie(self, response: Response, value: str, secure: bool) -> None:
        response.set_cookie(COOKIE, value, max_age=self.max_age_s, path="/", httponly=True, samesite="strict", secure=secure)

    def clear_cookie(self, response: Response, secure: bool) -> None:
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=secure)
