"""The CLI as a user drives it: real `tenure` subprocesses against a real store."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tenure.app import open_backends
from tenure.settings import Settings
from tests.conftest import PYTHON, ROOT
from tests.integration.procs import FAST, WorkerProc

pytestmark = pytest.mark.slow


def tenure(
    url: str, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    full.update({"TENURE_DATABASE_URL": url, **(env or {})})
    return subprocess.run(
        [PYTHON, "-m", "tenure.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=full,
        cwd=ROOT,
        timeout=60,
    )


def job_count(url: str) -> int:
    out = tenure(url, "jobs", "--json", "--limit", "1000")
    assert out.returncode == 0, out.stderr
    return len(json.loads(out.stdout))


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["submit", "no_such_agent", "--input", "{}"], None, "unknown agent 'no_such_agent'"),
        (["submit", "echo", "--input", "{not json"], None, "--input is not valid JSON"),
        (["submit", "echo", "--input", "-"], "[1, 2,", "standard input is not valid JSON"),
        (["submit", "echo", "--input", "@/nonexistent/file.json"], None, "cannot read input file"),
        (["submit", "echo", "--input", '"\\ud800"'], None, "invalid_request: --input holds a lone UTF-16 surrogate"),
        (["submit", "echo", "--input", '{"\\udfff": 1}'], None, "invalid_request: --input holds a lone UTF-16"),
        (["submit", "echo", "--input", '"\udcff"'], None, "invalid_request: --input is not Unicode text"),  # raw byte
        (["submit", "echo", "--input", '{"a": NaN}'], None, "--input is not valid JSON: NaN is not a JSON number"),
        (["submit", "echo", "--input", "1e999"], None, "--input is not valid JSON: the number 1e999 is out of range"),
        (["submit", "echo", "--input", '"\\u0000"'], None, "invalid_request: --input holds U+0000"),
        (["submit", "echo", "--input", "[" * 65 + "]" * 65], None, "--input nests arrays and objects deeper than 64"),
        (["submit", "echo", "--input", "-"], "[" * 50000 + "]" * 50000, "standard input nests arrays and objects"),
        (["submit", "echo", "--priority", "-1"], None, "priority must be an integer from 0 to 100"),
        (["submit", "echo", "--max-attempts", "0"], None, "max_attempts must be an integer from 1"),
        (["submit", "echo", "--deadline-s", "-5"], None, "deadline_s must be a number of seconds"),
        (["submit", "echo", "--requires", "bad tag!"], None, "is not a valid capability tag"),
        (["job", "01a22726-0000-7000-8000-000000000000"], None, "no job"),
        (["job", "not-a-uuid"], None, "no job"),
        (["events", "not-a-uuid"], None, "no job"),
        (["requeue", "01a22726-0000-7000-8000-000000000000"], None, "no job"),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(
    sqlite_database_url: str, args: list[str], stdin: str | None, message: str
) -> None:
    out = tenure(sqlite_database_url, *args, stdin=stdin)
    assert out.returncode != 0
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert job_count(sqlite_database_url) == 0


def test_an_input_file_that_is_not_utf8_is_a_clear_error(sqlite_database_url: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"a": "\xff\xfe"}')
    out = tenure(sqlite_database_url, "submit", "echo", "--input", f"@{bad}")
    assert out.returncode == 1 and f"tenure: invalid_request: {bad} is not UTF-8 text" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and job_count(sqlite_database_url) == 0
    out = tenure(sqlite_database_url, "submit", "echo", "--input", "-", stdin="[" * 64 + "]" * 64)
    assert out.returncode == 0, out.stderr  # the limit itself is accepted


def test_input_over_the_size_limit_is_refused(sqlite_database_url: str, tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"blob": "x" * (1024 * 1024)}))
    out = tenure(sqlite_database_url, "submit", "echo", "--input", f"@{big}")
    assert out.returncode == 1 and "input_too_large" in out.stderr and "1048576" in out.stderr
    assert job_count(sqlite_database_url) == 0


def test_unknown_or_malformed_settings_stop_the_command(sqlite_database_url: str) -> None:
    out = tenure(sqlite_database_url, "jobs", env={"TENURE_HEARTBAET_S": "5"})
    assert out.returncode == 2 and "unknown setting TENURE_HEARTBAET_S" in out.stderr
    out = tenure(sqlite_database_url, "jobs", env={"TENURE_HEARTBEAT_S": "fast"})
    assert out.returncode == 2 and "TENURE_HEARTBEAT_S must be a number" in out.stderr
    out = tenure(sqlite_database_url, "jobs", env={"TENURE_HEARTBEAT_S": "5", "TENURE_CLAIM_TTL_S": "10"})
    assert out.returncode == 2 and "at least 3 heartbeats" in out.stderr


def test_idempotency_key_replay_and_conflict(sqlite_database_url: str) -> None:
    first = tenure(sqlite_database_url, "submit", "echo", "--input", '{"a": 1}', "--idempotency-key", "k")
    again = tenure(sqlite_database_url, "submit", "echo", "--input", '{"a": 1}', "--idempotency-key", "k")
    assert first.returncode == again.returncode == 0 and first.stdout == again.stdout
    clash = tenure(sqlite_database_url, "submit", "echo", "--input", '{"a": 2}', "--idempotency-key", "k")
    assert clash.returncode == 1 and "idempotency_conflict" in clash.stderr
    assert job_count(sqlite_database_url) == 1


def test_a_local_submit_at_the_queue_cap_is_a_clear_error_and_writes_nothing(database_url: str) -> None:
    caps = {"TENURE_MAX_QUEUED": "3"}
    for n in range(3):
        out = tenure(database_url, "submit", "echo", "--input", f'{{"n": {n}}}', "--requires", "no-worker", env=caps)
        assert out.returncode == 0, out.stderr
    out = tenure(database_url, "submit", "echo", "--input", '{"n": 3}', env=caps)
    assert out.returncode == 1 and "tenure: queue_full: 3 jobs are waiting to start; the limit is 3" in out.stderr
    assert "Traceback" not in out.stderr and job_count(database_url) == 3
    per_tenant = tenure(database_url, "submit", "echo", env={"TENURE_MAX_QUEUED_PER_TENANT": "2"})
    assert per_tenant.returncode == 1 and "tenant 'default' has more than 2 jobs waiting" in per_tenant.stderr
    assert job_count(database_url) == 3


async def test_a_local_submit_while_the_circuit_is_open_is_a_clear_error_and_writes_nothing(database_url: str) -> None:
    backends = await open_backends(Settings.of(database_url=database_url))
    try:
        for _ in range(3):  # the breaker's default threshold: what three timed-out executions of `hang` write
            await backends.jobs.record_circuit_failure("agent:hang")
    finally:
        await backends.close()
    out = tenure(database_url, "submit", "hang")
    assert out.returncode == 1 and "tenure: circuit_open: agent 'hang' timed out 3 times" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and job_count(database_url) == 0
    assert tenure(database_url, "submit", "echo").returncode == 0  # other agents flow
    assert job_count(database_url) == 1


def test_a_job_out_of_attempts_is_dead_listed_and_requeued(database_url: str, tmp_path: Path) -> None:
    worker = WorkerProc(database_url, tmp_path, "w", env={**FAST})
    try:
        out = tenure(
            database_url,
            "submit",
            "flaky",
            "--input",
            '{"fail_times": 5}',
            "--max-attempts",
            "2",
            "--wait",
            "--timeout",
            "45",  # under the subprocess's 60 s, so a stuck job is reported with the worker's log, not killed
            "--json",
            env={"TENURE_POLL_S": "0.2"},
        )
        assert out.returncode == 1, f"{out.stderr}\n--- worker log ---\n{worker.log()[-4000:]}"
        job = json.loads(out.stdout)
        assert job["state"] == "dead" and job["attempts"] == 2 and "after 2 attempts" in job["error_message"]
        dead = json.loads(tenure(database_url, "jobs", "--state", "dead", "--json").stdout)
        assert [j["id"] for j in dead] == [job["id"]]
        requeued = tenure(database_url, "requeue", job["id"], "--json")
        assert requeued.returncode == 0, requeued.stderr
        assert json.loads(requeued.stdout)["state"] == "queued"
        shown = json.loads(tenure(database_url, "job", job["id"], "--json").stdout)
        assert [e["outcome"] for e in shown["executions"]][:2] == ["failed", "dead"]
        workers = json.loads(tenure(database_url, "workers", "--json").stdout)
        assert [(w["pid"], w["state"]) for w in workers] == [(worker.pid, "active")]
        assert {"id", "host", "pid", "state", "jobs_held"} <= set(workers[0])
    finally:
        worker.stop()


def test_help_explains_every_command() -> None:
    out = subprocess.run([PYTHON, "-m", "tenure.cli", "--help"], capture_output=True, text=True, timeout=30)
    for command in ("migrate", "worker", "submit", "jobs", "job", "events", "requeue", "workers"):
        assert command in out.stdout
