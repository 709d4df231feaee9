"""The CLI's reference page, generated from the argument parsers themselves (`chaos.commands.cli`,
`engine.cli`): every command, its usage, and each argument with its default and help."""
from __future__ import annotations

import argparse


def page() -> str:
    """docs/reference/cli.md's text."""
    from chaos.commands.cli import build_parser
    from chaos.reference.docs import engine_parser
    lines = ["# The command line", "",
             "Generated from the argument parsers (`python -m chaos.docs --write`): what "
             "`ninelives COMMAND --help` prints, on one page. Exit codes: 0 every invariant "
             "with evidence holds, 1 an invariant failed, 2 the harness could not judge "
             "(bad input, an adapter's error, a partial run, or `--require-exercised` with "
             "a check not exercised), 130 interrupted.", ""]
    commands = dict(_commands(build_parser()))
    commands["engine"] = engine_parser()
    for name, parser in commands.items():
        lines += _command(f"ninelives {name}", parser, level=2)
    return "\n".join(lines).rstrip() + "\n"


def _commands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:  # argparse offers no public walk of its subcommands
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _command(prog: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    lines = [f"{'#' * level} `{prog}`", ""]
    description = (parser.description or "").strip()
    if description:
        lines += [description, ""]
    usage = parser.format_usage().replace("usage: ", "", 1).strip()
    usage = " ".join(usage.split()).replace(parser.prog, prog, 1)
    lines += ["```text", usage, "```", ""]
    rows = [_row(action) for action in parser._actions
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
            and action.help != argparse.SUPPRESS]
    if rows:
        lines += ["| argument | default | what it is |", "|---|---|---|", *rows, ""]
    for name, sub in _commands(parser):
        lines += _command(f"{prog} {name}", sub, level + 1)
    return lines


def _row(action: argparse.Action) -> str:
    name = ", ".join(action.option_strings) or action.dest
    if action.metavar and action.option_strings and action.nargs != 0:
        name += f" {action.metavar}"
    default = action.default
    shown = "" if default in (None, argparse.SUPPRESS, False, [], "") else f"`{default}`"
    text = " ".join((action.help or "").split()).replace("|", "\\|")
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        text += f" (one of: {', '.join(map(str, action.choices))})"
    name = name.replace("|", "\\|")
    return f"| `{name}` | {shown} | {text.replace('%%', '%')} |"
