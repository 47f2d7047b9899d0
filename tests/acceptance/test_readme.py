"""The README's first example runs as written: its `myapp.py`, then its shell commands, in a fresh directory."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT

pytestmark = pytest.mark.slow


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def _until_registered(cwd: Path, env: dict[str, str], timeout_s: float = 30.0) -> None:
    """Wait until `tenure workers --json` lists a worker (the README's own registry command)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(["tenure", "workers", "--json"], cwd=cwd, env=env, capture_output=True, text=True)
        if out.returncode == 0 and json.loads(out.stdout or "[]"):
            return
        time.sleep(0.2)
    raise AssertionError("the backgrounded worker never registered")


def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Use it") :]
    (tmp_path / "myapp.py").write_text(_blocks(section, "python")[0], encoding="utf-8")
    (tmp_path / "a.txt").write_text("some text to hash\n", encoding="utf-8")
    commands = [line.split("#", 1)[0].strip() for line in _blocks(section, "bash")[0].splitlines()]
    commands = [c for c in commands if c]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env["TENURE_DATABASE_URL"] = f"sqlite:///{tmp_path}/tenure.db"
    bin_dir = Path(PYTHON).parent
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"  # `tenure` as installed by make dev
    worker = None
    try:
        for command in commands:
            words = shlex.split(command)
            if words[0] == "export":
                name, _, value = words[1].partition("=")
                env[name] = value
                continue
            assert words[0] == "tenure", command
            if words[-1] == "&":
                worker = subprocess.Popen(
                    words[:-1], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )  # fmt: skip
                _until_registered(tmp_path, env)  # the next command is typed once the worker is up
                continue
            if "JOB_ID" in words:
                continue  # placeholders
            out = subprocess.run(words, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, (command, out.stdout, out.stderr)
            if words[1] == "submit":
                job = json.loads(out.stdout) if out.stdout.startswith("{") else None
                assert "succeeded" in out.stdout, out.stdout
                assert job is None or job["state"] == "succeeded"
    finally:
        if worker is not None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
    assert worker is not None, "the README starts a worker"
    assert not any(c.startswith("export TENURE_APP") for c in commands), "the producer needs no app of its own"
