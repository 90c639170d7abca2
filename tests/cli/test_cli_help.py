"""``specrt <command> --help`` documents every argument: its choices, its default, what a positional is."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from specrt import cli
from specrt.convert import SUPPORTED_DTYPES

#: Defined by specrt.bench.add_arguments and formatted by its owner (``bench --help`` is kept as it is).
SKIPPED = {"specrt bench"}


def _commands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(``prog``, parser) of every command and subcommand below ``parser`` (each once, aliases skipped)."""
    seen: set[int] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if id(sub) in seen or sub.prog in SKIPPED:
                    continue
                seen.add(id(sub))
                yield sub.prog, sub
                yield from _commands(sub)


COMMANDS = dict(_commands(cli.build_parser()))


def _required_by_group(parser: argparse.ArgumentParser, action: argparse.Action) -> bool:
    """Whether ``action`` belongs to a required mutually exclusive group (one of them must be given)."""
    return any(g.required and action in g._group_actions for g in parser._mutually_exclusive_groups)


def test_every_command_is_checked() -> None:
    assert set(COMMANDS) >= {
        "specrt generate",
        "specrt models",
        "specrt models pull",
        "specrt models list",
        "specrt models rm",
        "specrt convert",
        "specrt cost",
    }


@pytest.mark.parametrize("prog", sorted(COMMANDS))
def test_every_argument_has_help_with_its_default_and_choices(prog: str) -> None:
    parser = COMMANDS[prog]
    text = parser.format_help()
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.help == argparse.SUPPRESS:  # hidden test-only switches (certify --fault)
            continue
        name = "/".join(action.option_strings) or action.dest
        rendered = parser._get_formatter()._expand_help(action) if action.help else ""
        assert rendered.strip(), f"{prog} {name} has no help"
        if action.choices is not None:
            listed = "{" + ",".join(map(str, action.choices)) + "}"
            assert listed in text, f"{prog} {name}: choices {listed} not in --help"
        takes_value = action.nargs != 0
        optional = action.option_strings and not action.required and not _required_by_group(parser, action)
        if takes_value and optional:
            assert "(default" in rendered, f"{prog} {name}: help {rendered!r} does not say its default"


@pytest.mark.parametrize("prog", ["specrt convert", "specrt models pull"])
def test_dtype_lists_every_supported_dtype(prog: str) -> None:
    (dtype,) = (a for a in COMMANDS[prog]._actions if "--dtype" in a.option_strings)
    assert tuple(dtype.choices) == SUPPORTED_DTYPES == cli.DTYPES
    assert dtype.default == "fp32"
    text = COMMANDS[prog].format_help()
    assert "--dtype {fp32,fp16,int4,int8,gguf}" in text
    assert "(default: fp32)" in " ".join(text.split())


def test_convert_help_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["convert", "--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for expected in ("--dtype {fp32,fp16,int4,int8,gguf}", "src a .gguf file", "out the model folder to create"):
        assert expected in out


def test_an_invalid_dtype_is_rejected_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["convert", "m.gguf", "out", "--dtype", "int3"])
    assert exit_.value.code == 2
    assert "invalid choice: 'int3' (choose from" in capsys.readouterr().err


def test_a_bad_suffix_cache_size_is_named_by_its_flag_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    # the Decoder's check (Rust's) runs before the model name is resolved: no model is pulled for this
    assert cli.main(["serve", "--target", "no-such-model-is-ever-pulled", "--suffix-cache-tokens", "-5"]) == 2
    err = capsys.readouterr().err
    assert "--suffix-cache-tokens -5 is invalid" in err, err


def test_help_shows_the_numbers_of_rust_defaults_not_their_names() -> None:
    from specrt import _specrt

    for prog, parser in COMMANDS.items():
        assert "_specrt." not in parser.format_help(), f"{prog} --help names a constant instead of its value"
    text = " ".join(COMMANDS["specrt serve"].format_help().split())
    assert f"(default: {_specrt.DEFAULT_MAX_PREFILL_TOKENS}, the Decoder's)" in text
