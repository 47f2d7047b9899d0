"""Quota configuration: TENURE_QUOTAS and tenure.toml are parsed strictly; anything malformed stops start-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from tenure.contracts.errors import ConfigError
from tenure.contracts.quotas import QuotaSpec, format_quotas, parse_quotas
from tenure.settings import Settings, load_quota_file


def test_tenure_quotas_declares_limits_and_failure_policies_per_key() -> None:
    settings = Settings.from_env({"TENURE_QUOTAS": "llm:gpt-4o=8, llm:mock=8/fail-open,gpu-pool=2/fail-closed"})
    assert settings.quotas == {
        "llm:gpt-4o": QuotaSpec("llm:gpt-4o", 8),
        "llm:mock": QuotaSpec("llm:mock", 8, "fail-open"),
        "gpu-pool": QuotaSpec("gpu-pool", 2),
    }
    assert settings.quotas["llm:mock"].fail_open and not settings.quotas["gpu-pool"].fail_open
    assert parse_quotas(format_quotas(settings.quotas)) == settings.quotas


@pytest.mark.parametrize(
    "text",
    [
        "llm",
        "llm=",
        "=3",
        "llm=0",
        "llm=-1",
        "llm=eight",
        "llm=2.5",
        "llm=3/fail-sometimes",
        "a=1,a=2",
        "bad key=1",
        "k#wait=1",
    ],
)
def test_a_malformed_tenure_quotas_is_a_start_up_error(text: str) -> None:
    with pytest.raises(ConfigError):
        Settings.from_env({"TENURE_QUOTAS": text})


def test_tenure_toml_declares_quotas_as_limits_or_tables(tmp_path: Path) -> None:
    path = tmp_path / "tenure.toml"
    path.write_text('[quotas]\n"llm:mock" = 8\n"llm:gpt-4o" = { limit = 4, on_failure = "fail-open" }\n')
    assert load_quota_file(str(path)) == {
        "llm:mock": QuotaSpec("llm:mock", 8),
        "llm:gpt-4o": QuotaSpec("llm:gpt-4o", 4, "fail-open"),
    }
    assert load_quota_file(str(tmp_path / "absent.toml")) == {}


@pytest.mark.parametrize(
    "body",
    [
        '[quotas]\n"k" = "eight"\n',
        '[quotas]\n"k" = { limit = 2, colour = "red" }\n',
        '[quotas]\n"k" = {}\n',
        '[quota]\n"k" = 1\n',
        "quotas = 3\n",
        "[quotas\n",
    ],
)
def test_a_malformed_tenure_toml_is_a_start_up_error(tmp_path: Path, body: str) -> None:
    path = tmp_path / "tenure.toml"
    path.write_text(body)
    with pytest.raises(ConfigError):
        load_quota_file(str(path))
