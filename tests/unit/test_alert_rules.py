"""The shipped alert rules are valid and do what their tests say: `promtool check rules` and
`promtool test rules` on every build. promtool is installed by scripts/ensure-tools.sh (`make test`);
a missing promtool fails here, it never skips."""

from __future__ import annotations

import shutil
import subprocess

from tests.conftest import ROOT

RULES = ROOT / "deploy" / "prometheus"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run scripts/ensure-tools.sh (make test does)"
    return subprocess.run([promtool, *args], cwd=RULES, capture_output=True, text=True, timeout=60)


def test_promtool_accepts_the_alert_rules() -> None:
    result = _promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alert_rules_pass_their_promtool_unit_tests() -> None:
    result = _promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_metric_the_rules_query_is_defined_by_tenure() -> None:
    import re

    from prometheus_client import REGISTRY

    import tenure.observability.metrics  # noqa: F401  (defines them on the default registry)

    text = (RULES / "alerts.yml").read_text()
    text += (ROOT / "deploy" / "grafana" / "tenure-dashboard.json").read_text()
    used = set(re.findall(r"\b((?:tenure|event_loop)_[a-z_]+)", text))
    defined = {name for c in REGISTRY._collector_to_names for name in REGISTRY._collector_to_names[c]}
    missing = {n for n in used if n not in defined and re.sub(r"_(bucket|count|sum)$", "", n) not in defined}
    assert not missing, f"queried by alerts or dashboard but never exported: {sorted(missing)}"
