"""Docs that must say what the code does: docs/cli.md has a section per command naming each of its flags, and
docs/configuration.md lists every setting `Settings` reads."""

from __future__ import annotations

import argparse
import re

from tenure.cli import build_parser
from tenure.settings import VARIABLES
from tests.conftest import ROOT

COMMON = {"--database-url", "--app", "--json", "--help"}


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _sections(text: str) -> dict[str, str]:
    """`### \\`tenure NAME ...\\`` sections of a page, by command name."""
    parts = re.split(r"^### `tenure ([a-z-]+)[^`]*`\s*$", text, flags=re.MULTILINE)
    return {name: body for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def test_the_cli_page_has_a_section_per_command_naming_each_of_its_flags() -> None:
    sections = _sections((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"))
    commands = _commands()
    assert sorted(sections) == sorted(commands), "docs/cli.md: one `### `tenure NAME`` section per command"
    missing = {
        name: flags
        for name, sp in commands.items()
        if (flags := sorted({o for a in sp._actions for o in a.option_strings if o.startswith("--")} - COMMON
                            - set(re.findall(r"--[a-z-]+", sections[name]))))
    }  # fmt: skip
    assert not missing, f"flags missing from their command's section of docs/cli.md: {missing}"


def test_the_configuration_page_lists_every_setting() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    names = VARIABLES
    missing = sorted(n for n in names if f"`TENURE_{n.upper()}`" not in text)
    assert not missing, f"settings missing from docs/configuration.md: {missing}"
