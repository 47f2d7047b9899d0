"""Every example runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import PYTHON, ROOT


def test_quickstart_runs_and_shows_a_retry_and_a_stream(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env["TENURE_DATABASE_URL"] = f"sqlite:///{tmp_path}/q.db"
    out = subprocess.run(
        [PYTHON, str(Path(ROOT) / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "greet      succeeded attempts=1 result={'greeting': 'hello Tenure'}" in out.stdout
    assert "unreliable succeeded attempts=2" in out.stdout
    assert "execution.retrying" in out.stdout and "message.delta" in out.stdout


def test_the_budgets_example_stops_a_runaway_at_its_agents_default_and_lets_a_job_override_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env["TENURE_DATABASE_URL"] = f"sqlite:///{tmp_path}/b.db"
    out = subprocess.run(
        [PYTHON, str(Path(ROOT) / "examples" / "budgets.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert (
        "agent default      failed    budget_exhausted the job's tool_calls budget is exhausted: 5 used of 5" in out.stdout
    )
    assert "own tool_calls=20  succeeded  {'calls': 8}" in out.stdout
    assert (
        "own tokens=300     failed    budget_exhausted the job's tokens budget is exhausted: 300 used of 300" in out.stdout
    )


def test_the_coordinator_example_gathers_its_children(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env["TENURE_DATABASE_URL"] = f"sqlite:///{tmp_path}/c.db"
    out = subprocess.run(
        [PYTHON, str(Path(ROOT) / "examples" / "coordinator.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "word_count succeeded result={'sentences': 6, 'words': 63}" in out.stdout
    assert out.stdout.count("count_words succeeded") == 6
    assert "parent events: job.waiting → job.resumed" in out.stdout
