from __future__ import annotations

import random
import re
import uuid

import pytest

from tenure.backends._queries import load_queries
from tenure.contracts.errors import ConfigError
from tenure.contracts.types import new_id, parse_cursor
from tenure.control.retry import backoff_s
from tenure.worker.faults import Faults


def test_ids_are_uuid7_and_strictly_increasing_within_a_process() -> None:
    ids = [new_id() for _ in range(10_000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert uuid.UUID(ids[0]).version == 7


def test_cursors_parse_or_raise() -> None:
    assert parse_cursor("3-17") == (3, 17)
    for bad in ("", "3", "3-", "-1-2", "a-b", "1-2-3"):
        with pytest.raises(ValueError):
            parse_cursor(bad)


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    rng = random.Random(7)
    for attempt, base in ((1, 1.0), (2, 2.0), (3, 4.0)):
        d = backoff_s(attempt, 1.0, 300.0, rng)
        assert base / 2 <= d <= base
    assert backoff_s(30, 1.0, 60.0, rng) <= 60.0


def test_every_query_has_a_header_and_a_description() -> None:
    for dialect in ("postgres", "sqlite"):
        queries = load_queries(f"tenure.backends.{dialect}")
        assert len(queries) > 20
        for name, sql in queries.items():
            assert sql.startswith("--"), f"{dialect}:{name} lacks its one-line description"


def test_fault_rules_parse_and_reject_nonsense() -> None:
    f = Faults.parse("after_claim=stop, after_start@echo=sleep:1.5")
    assert [(r.point, r.agent, r.action, r.seconds) for r in f.rules] == [
        ("after_claim", None, "stop", 0.0),
        ("after_start", "echo", "sleep", 1.5),
    ]
    for bad in ("nowhere=stop", "after_claim", "after_claim=explode", "after_claim=sleep:x"):
        with pytest.raises(ConfigError):
            Faults.parse(bad)


def _where_lines(sql: str, marker: str) -> list[str]:
    """The condition lines of the UPDATE that follows `marker`, whitespace-normalised."""
    body = sql[sql.index(marker) :]
    lines = body[body.index(" WHERE ") :].splitlines()
    out = []
    for line in lines:
        line = " ".join(line.split())
        if not (line.startswith(("WHERE", "AND"))):
            break
        out.append(line)
    return out


def _set_items(sql: str, marker: str) -> set[str]:
    """The assignments of the UPDATE that follows `marker`, whitespace-normalised."""
    body = sql[sql.index(marker) :]
    end = re.search(r"\s(FROM|WHERE)\s", body[body.index(" SET ") + 5 :])
    assert end is not None
    sets = body[body.index(" SET ") + 5 :][: end.start()]
    return {" ".join(item.split()) for item in re.split(r",\s*(?![^()]*\))", sets)}


def test_claim_start_function_keeps_every_condition_of_the_claim_and_the_start() -> None:
    q = load_queries("tenure.backends.postgres")
    fn = q["claim_start_function"].replace("p_worker", "$1").replace("p_token", "$6").replace("p_ttl", "$5")
    claim = _where_lines(q["claim_jobs"], "UPDATE jobs AS j")
    assert len(claim) == 3
    # One UPDATE: the claim's conditions (the candidates by tuple id and id, from the arrays the function read
    # them into); the start's (owner, epoch, token of an unstarted claim) hold by construction for a row the same
    # statement claims.
    arrays = {"ARRAY(SELECT ctid FROM candidates)": "v_ctids", "ARRAY(SELECT id FROM candidates)": "v_ids"}
    for k, v in arrays.items():
        claim = [line.replace(k, v) for line in claim]
    assert _where_lines(fn, "UPDATE jobs AS j") == claim
    assert fn.count("UPDATE jobs") == 1
    # Its SET is the claim's and the start's, the execution id taken from the array instead of $5.
    claim_set = _set_items(q["claim_jobs"], "UPDATE jobs AS j")
    start_set = _set_items(q["start_executions"], "UPDATE jobs AS j")
    start_set = {x.replace("x.execution_id", "p_executions[array_position(v_ids, j.id)]") for x in start_set}
    assert _set_items(fn, "UPDATE jobs AS j") == claim_set | start_set
    claim_sql = q["claim_jobs"]
    candidates = claim_sql[claim_sql.index("WITH candidates") : claim_sql.index("UPDATE jobs AS j")].rstrip()
    fn_candidates = fn[fn.index("WITH candidates") : fn.index("SELECT array_agg")].rstrip()
    normal = {"$2::text[]": "p_agents", "$3::text[]": "p_caps", "$4": "p_limit"}
    for k, v in normal.items():
        candidates = candidates.replace(k, v)
    assert " ".join(fn_candidates.split()) == " ".join(candidates.split())


def test_sqlite_claim_and_start_keeps_every_condition_of_the_claim_and_the_start() -> None:
    q = load_queries("tenure.backends.sqlite")
    claim, start, both = q["claim_jobs"], q["start_execution"], q["claim_and_start"]

    def norm(text: str) -> str:
        return " ".join(text.split())

    # The same candidates (claim_candidates, filled in per worker by _claims.py) and the same claim conditions on
    # each row.
    assert claim.count("{candidates}") == 1 and both.count("{candidates}") == 1
    # (Neither has a RETURNING clause: the jobs are read back by `claimed_jobs`; each statement ends there.)
    assert "RETURNING" not in claim and "RETURNING" not in both
    outer = claim[claim.index("({candidates}))") + len("({candidates}))") :]
    assert norm(both[both.index("WHERE jobs.id = c.id") + len("WHERE jobs.id = c.id") :]) == norm(outer)
    # The SET is the claim's and the start's, the execution id taken from the JSON array instead of ?5.
    sets = {"claim": claim, "start": start, "both": both}
    items = {
        k: {
            norm(x)
            for x in re.split(
                r",\s*(?![^()]*\))", v[v.index(" SET ") + 5 : v.index(" WHERE " if k != "both" else " FROM c")]
            )
        }
        for k, v in sets.items()
    }
    items["start"] = {
        x.replace("execution_id = ?5", "execution_id = json_extract(?7, '$[' || c.n || ']')") for x in items["start"]
    }
    assert items["both"] == items["claim"] | items["start"]


def test_offers_matches_as_written_or_by_a_whole_category() -> None:
    from tenure.contracts.profile import offers

    assert offers([], [])
    assert offers(["text/*"], ["text/summarize", "text/translate"])
    assert not offers(["text/*"], ["image/ocr"])
    assert not offers(["text/*"], ["text"])  # a flat tag is not its category
    assert offers(["gpu", "text/*"], ["gpu", "text/x"]) and not offers(["text/*"], ["gpu"])
    assert offers(["text/summarize"], ["text/summarize"]) and not offers(["text/summarize"], ["text/translate"])
