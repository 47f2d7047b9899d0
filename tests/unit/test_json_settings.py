"""The one reader of JSON-object settings (contracts/json_settings.py): TENURE_PRICES, TENURE_TENANT_BUDGETS and
TENURE_TENANT_RETENTION_DAYS refuse a bad value in the same words, naming the setting (and the entry)."""

from __future__ import annotations

import pytest

from tenure.contracts.audit import Price
from tenure.contracts.errors import ConfigError
from tenure.control.tenant_budgets import TenantBudget
from tenure.settings import Settings

GOOD = {
    "TENURE_PRICES": ('{"m": {"input": 0.5, "output": 0}}', "prices", {"m": Price(0.5, 0.0)}),
    "TENURE_TENANT_BUDGETS": ('{"a": {"tokens": 10}}', "tenant_budgets", {"a": TenantBudget(10, None, 86400.0)}),
    "TENURE_TENANT_RETENTION_DAYS": ('{"a": 7, "b": 0.5}', "tenant_retention_days", {"a": 7.0, "b": 0.5}),
}


def _value(s: Settings, attr: str) -> object:
    return getattr(s.limits if attr == "tenant_budgets" else s.worker, attr)


@pytest.mark.parametrize("name", sorted(GOOD))
def test_each_json_object_setting_reads_its_entries_and_takes_empty_text_as_none(name: str) -> None:
    text, attr, expected = GOOD[name]
    assert _value(Settings.from_env({name: text}), attr) == expected
    assert _value(Settings.from_env({name: "  "}), attr) == {}


@pytest.mark.parametrize("name", sorted(GOOD))
@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{nope", "{name} is not JSON (.*); expected an object such as {{"),
        ("[1, 2]", "{name} must be a JSON object, such as {{"),
        ('"x"', "{name} must be a JSON object"),
        ('{"k": null}', "{name}: 'k' needs"),
        ('{"k": true}', "{name}: 'k' needs"),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting_and_the_entry(name: str, text: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said.format(name=name).replace("[", r"\[").replace("(.*)", r"\(.*\)")):
        Settings.from_env({name: text})


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        (
            "TENURE_PRICES",
            '{"m": {"input": -1, "output": 1}}',
            "TENURE_PRICES: 'm' needs prices that are finite numbers >= 0",
        ),
        ("TENURE_PRICES", '{"m": {"input": 1}}', 'TENURE_PRICES: \'m\' needs exactly "input" and "output"'),
        ("TENURE_TENANT_BUDGETS", '{"a": {"tokens": 0}}', "TENURE_TENANT_BUDGETS: 'a' tokens must be a positive number"),
        ("TENURE_TENANT_BUDGETS", '{"a": {"window_s": 5}}', "TENURE_TENANT_BUDGETS: 'a' needs tokens and/or cost"),
        ("TENURE_TENANT_RETENTION_DAYS", '{"a": -3}', "TENURE_TENANT_RETENTION_DAYS: 'a' needs a positive number of days"),
    ],
)
def test_each_setting_keeps_its_own_entry_rule(name: str, text: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        Settings.from_env({name: text})
