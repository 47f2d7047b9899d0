"""A small registry of named SQL queries, one file per dialect.

Each query in `queries.sql` sits under a header line `-- name: claim_jobs --` followed by one comment line
saying what it does. The file is parsed once at import.

The two dialects do not define the same names, on purpose: each names its statements for its own shape
(PostgreSQL claims, starts or finishes a whole batch in one statement; SQLite runs one statement per row inside
one transaction). What keeps the backends from drifting apart is behaviour, not names: the contract suite
(tests/contract) runs every store method against both, and the domain rules the SQL is given come from one
place (`_rules.py`). tests/unit/test_queries.py checks that every query a backend runs is defined, that every
defined query is run, and that each says what it does.
"""

from __future__ import annotations

import re
from importlib import resources

_HEADER = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*--\s*$", re.MULTILINE)


def load_queries(package: str, filename: str = "queries.sql", substitutions: dict[str, str] | None = None) -> dict[str, str]:
    """Parse `filename` of `package` into {name: sql}, replacing each `{key}` of `substitutions`."""
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    for key, value in (substitutions or {}).items():
        text = text.replace("{" + key + "}", value)
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} defined twice in {package}/{filename}")
        queries[name] = body.strip()
    return queries


def load_migrations(package: str) -> list[tuple[int, str, str]]:
    """The numbered migration files of `package`.migrations as (version, name, sql), in order."""
    out = []
    for entry in resources.files(package).joinpath("migrations").iterdir():
        m = re.fullmatch(r"(\d{4})_([a-z0-9_]+)\.sql", entry.name)
        if m:
            out.append((int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    out.sort()
    for i, (version, _, _) in enumerate(out, start=1):
        if version != i:
            raise ValueError(f"migrations of {package} are not numbered 1..n (found {version} at {i})")
    return out
