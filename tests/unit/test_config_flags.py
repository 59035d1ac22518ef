"""Flags derived from config dataclasses (specserve/flags.py): one per field, parsed by its type, helped by
its docstring, absent unless given (so the dataclass keeps the default), never for a secret."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

import pytest

from orchestrator.config import OrchestratorConfig
from specserve.flags import NO_FLAG, add_config_flags, build_from_flags, field_docs, first_sentence, flag, flags_for


@dataclass(frozen=True, slots=True)
class Example:
    count: int = 3
    """How many. More words that stay out of the help."""
    ratio: float | None = None
    """A share of 100%, e.g. 0.5."""
    names: tuple[str, ...] = ("a", "b")
    enabled: bool = True
    """Whether on."""
    kind: str = field(default="x", metadata=flag("--sort", choices=("x", "y")))
    secret: str | None = field(default=None, metadata=NO_FLAG)
    mapping: dict[str, int] = field(default_factory=dict)
    stop: tuple[str, ...] = field(default=(), metadata=flag(one_per_flag=True))


def parser_for(cls: type, **options: object) -> tuple[argparse.ArgumentParser, list[str]]:
    parser = argparse.ArgumentParser()
    return parser, add_config_flags(parser, cls, **options)  # type: ignore[arg-type]


def test_one_flag_per_field_a_command_line_can_hold() -> None:
    parser, names = parser_for(Example)
    assert names == ["count", "ratio", "names", "enabled", "kind", "stop"]  # no secret, no mapping
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["count"] == "How many. (default: 3)"
    assert helps["ratio"] == "A share of 100%%, e.g. 0.5."  # argparse formats %: escaped
    assert helps["names"] == "default: a b"  # undocumented: the default alone
    assert helps["enabled"] == "Whether on. (default: on)"
    parser.format_help()  # every help string formats


def test_values_parse_by_type_and_only_the_given_ones_reach_the_config() -> None:
    parser, _ = parser_for(Example)
    assert build_from_flags(Example, parser.parse_args([])) == Example()
    args = parser.parse_args(["--count", "5", "--ratio", "0.5", "--names", "c", "d", "--no-enabled", "--sort", "y"])
    assert build_from_flags(Example, args) == Example(5, 0.5, ("c", "d"), False, "y")
    args = parser.parse_args(["--names", "c", "d", "--names", "e", "--stop", "x", "--stop", "y"])  # more values
    assert build_from_flags(Example, args) == Example(names=("c", "d", "e"), stop=("x", "y"))
    with pytest.raises(SystemExit):
        parser.parse_args(["--sort", "z"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--secret", "s"])


def test_a_prefix_names_the_flags_and_dests_of_one_role() -> None:
    parser, _ = parser_for(Example, only=["count", "enabled", "kind"], prefix="draft-")
    args = parser.parse_args(["--draft-count", "2", "--no-draft-enabled", "--draft-sort", "y"])
    assert (args.draft_count, args.draft_enabled, args.draft_kind) == (2, False, "y")
    assert build_from_flags(Example, args, ["count", "enabled"], prefix="draft-") == Example(2, enabled=False)


def test_a_field_no_flag_can_parse_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="Example.mapping"):
        parser_for(Example, only=["mapping"])


def test_the_first_sentence_keeps_abbreviations() -> None:
    assert first_sentence("Pins the role, e.g. {'x': 1}: there.  More.") == "Pins the role, e.g. {'x': 1}: there."
    assert first_sentence("No full stop") == "No full stop"
    assert field_docs(Example)["count"].startswith("How many.")


def test_every_orchestrator_setting_is_a_flag_except_the_secured_ones() -> None:
    _, names = parser_for(OrchestratorConfig)
    secured = {"tls", "worker_tls", "api_key"}
    assert set(names) == {f.name for f in dataclasses.fields(OrchestratorConfig)} - secured
    assert set(field_docs(OrchestratorConfig)) >= set(names)  # each documented where it is declared


def test_a_launcher_writes_the_command_line_the_parser_reads_back() -> None:
    parser, _ = parser_for(Example)
    for config in (Example(), Example(7, 0.25, ("z",), False, "y", stop=("a", "b"))):
        assert build_from_flags(Example, parser.parse_args(flags_for(config))) == config
    with pytest.raises(ValueError, match="names: no command line says"):
        flags_for(Example(names=()))
