"""The layers of DESIGN.md are a test: lint-imports checks pyproject's contracts on every run, and the list of
allowed exceptions may only shrink."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import tenure
from tests.conftest import ROOT

# The number of `ignore_imports` exceptions across all layer contracts. Lower it when you pay debt back;
# raising it fails this test on purpose.
MAX_EXCEPTIONS = 0


def test_import_layers_hold() -> None:
    lint = Path(ROOT) / ".venv" / "bin" / "lint-imports"
    exe = str(lint) if lint.exists() else "lint-imports"
    out = subprocess.run([exe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_the_list_of_layer_exceptions_only_shrinks() -> None:
    config = tomllib.loads((Path(ROOT) / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    exceptions = sum(len(c.get("ignore_imports", [])) for c in contracts)
    assert exceptions <= MAX_EXCEPTIONS


def test_public_api_is_exactly_what_all_names() -> None:
    public = {n for n in dir(tenure) if not n.startswith("_")} | {"__version__"}
    modules = {n for n in public if type(getattr(tenure, n)).__name__ == "module"}
    assert set(tenure.__all__) == public - modules
    for name in tenure.__all__:
        assert getattr(tenure, name) is not None


def test_importing_tenure_loads_no_database_or_redis_driver() -> None:
    """An agent module imports `tenure` only: the client side (and with it the drivers) loads on first use; the
    S3 client (the optional `tenure[s3]`) loads only when an S3 artifact store makes its first call."""
    import subprocess
    import sys

    code = "import tenure, sys; assert not {'asyncpg', 'redis', 'boto3', 'botocore'} & set(sys.modules), sorted(sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    code = "import tenure.app, tenure.backends.s3_artifacts, sys; assert not {'boto3', 'botocore'} & set(sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]


MAX_MODULE_LINES = 500


def test_no_module_of_the_runtime_is_over_500_lines() -> None:
    """A module that outgrows one screenful of concerns is split by concern (issue 11: the worker was 1,060
    lines doing eight jobs). The OpenAPI document is derived from the models, so no file is exempt."""
    src = Path(__file__).resolve().parents[2] / "src" / "tenure"
    long = {
        str(p.relative_to(src)): n
        for p in sorted(src.rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {long}"
