"""Every example runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import PYTHON, ROOT


def _run_example(name: str, tmp_path: Path) -> str:
    """Run examples/NAME.py on a SQLite file of its own, with no TENURE_ setting of the caller; its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env["TENURE_DATABASE_URL"] = f"sqlite:///{tmp_path}/{name}.db"
    out = subprocess.run(
        [PYTHON, str(Path(ROOT) / "examples" / f"{name}.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_quickstart_runs_and_shows_a_retry_and_a_stream(tmp_path: Path) -> None:
    stdout = _run_example("quickstart", tmp_path)
    assert "greet      succeeded attempts=1 result={'greeting': 'hello Tenure'}" in stdout
    assert "unreliable succeeded attempts=2" in stdout
    assert "execution.retrying" in stdout and "message.delta" in stdout


def test_the_budgets_example_stops_a_runaway_at_its_agents_default_and_lets_a_job_override_it(tmp_path: Path) -> None:
    stdout = _run_example("budgets", tmp_path)
    assert "agent default      failed    budget_exhausted the job's tool_calls budget is exhausted: 5 used of 5" in stdout
    assert "own tool_calls=20  succeeded  {'calls': 8}" in stdout
    assert "own tokens=300     failed    budget_exhausted the job's tokens budget is exhausted: 300 used of 300" in stdout


def test_the_coordinator_example_gathers_its_children(tmp_path: Path) -> None:
    stdout = _run_example("coordinator", tmp_path)
    assert "word_count succeeded result={'sentences': 6, 'words': 63}" in stdout
    assert stdout.count("count_words succeeded") == 6
    assert "parent events: job.waiting → job.resumed" in stdout
