"""The query registries of both dialects: every query a backend runs is defined, every defined query is run, and
the one payload still assembled in two languages (the finish's, around the database's retry time) has the
same keys in both."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

from tenure.backends import _rules
from tenure.backends._queries import load_queries
from tenure.contracts.states import JobState
from tenure.contracts.types import Fence, Finish

_USE = re.compile(r"""\bQ\[["']([a-z_][a-z0-9_]*)["']\]""")
_CLAIM_SQL = re.compile(r"""\bclaim_sql\(["']([a-z_]+)["']""")  # a claim statement filled in per worker (_claims.py)
_PER_STATE = re.compile(r"""\bper_state\(Q, \(([^)]*)\)\)""")  # queries filled in per state (_state_pages.py)


def _used(dialect: str, sql_file: str) -> set[str]:
    """The queries the modules of `dialect` that load `sql_file` run (the dashboard's read side has a file of
    its own, insights.sql, loaded by insights.py; every other module runs queries.sql)."""
    used: set[str] = set()
    for entry in resources.files(f"tenure.backends.{dialect}").iterdir():
        own = {"insights.py": "insights.sql", "audit.py": "audit.sql"}.get(entry.name, "queries.sql")
        if entry.name.endswith(".py") and own == sql_file:
            text = entry.read_text(encoding="utf-8")
            used |= set(_USE.findall(text)) | set(_CLAIM_SQL.findall(text))
            used |= {n for names in _PER_STATE.findall(text) for n in re.findall(r"[a-z_]+", names)}
    return used


@pytest.mark.parametrize("sql_file", ["queries.sql", "insights.sql", "audit.sql"])
@pytest.mark.parametrize("dialect", ["postgres", "sqlite"])
def test_every_query_a_backend_runs_is_defined_and_every_defined_query_is_run(dialect: str, sql_file: str) -> None:
    defined = set(load_queries(f"tenure.backends.{dialect}", sql_file))
    used = _used(dialect, sql_file)
    assert used - defined == set(), "run but not defined"
    if sql_file != "insights.sql":  # insights.py picks its keyset-page queries by name at run time (job_page_*)
        assert defined - used == set(), "defined but never run"


def test_the_finish_payload_has_the_same_keys_in_both_dialects() -> None:
    sql = load_queries("tenure.backends.postgres")["finish_executions"]
    built = sql[sql.index("json_build_object(") : sql.index("next_attempt_at',") + len("next_attempt_at'")]
    postgres_keys = re.findall(r"'([a-z_]+)',", built + ",")
    finish = Finish(Fence("j", 1, 2), "x", 0.0, JobState.SUCCEEDED, 2, "null")
    assert postgres_keys == list(json.loads(_rules.finish_payload(finish, None)))
