"""The ``kq`` command line.

Subcommands come from :data:`COMMANDS`, a list of ``(name, "module:function")``
entries, each a module of :mod:`kq.commands`.  To add one, append an entry;
``function(subparsers)`` must add the subcommand ``name`` with
``subparsers.add_parser(name, help=...)`` (a command made of subcommands:
:func:`kq.commands.common.add_command_group`) and set its ``func`` default
(``parser.set_defaults(func=...)``) to a callable that takes the parsed
:class:`argparse.Namespace` and returns the exit status (``None`` means 0).

Modules are imported lazily: ``kq NAME ...`` imports only NAME's module, and
only ``kq``/``kq --help`` import them all, to list them.  A command whose module
cannot be imported, or whose ``function`` fails, is still listed; using it
prints why it is unavailable and exits 1, and every other command still works.
Set ``KQ_DEBUG=1`` to also print the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeAlias

from kq import __version__

if TYPE_CHECKING:
    from kq.commands.common import Subparsers

Handler: TypeAlias = Callable[[argparse.Namespace], "int | None"]
"""What a subcommand's ``func`` default must be."""

COMMANDS: list[tuple[str, str]] = [
    ("version", "kq.cli:register_version"),
    ("sim", "kq.commands.sim:register"),
    ("storage", "kq.commands.storage:register"),
    ("controller", "kq.commands.controller:register"),
    ("broker", "kq.commands.broker:register"),
    ("quorum", "kq.commands.quorum:register"),
    ("cluster", "kq.commands.cluster:register"),
    ("certs", "kq.commands.certs:register"),
    ("acls", "kq.commands.acls:register"),
    ("kv", "kq.commands.kv:register"),
    ("topics", "kq.commands.topics:register"),
    ("configs", "kq.commands.configs:register"),
    ("brokers", "kq.commands.brokers:register"),
    ("leader-election", "kq.commands.leader_election:register"),
    ("reassign", "kq.commands.reassign:register"),
    ("features", "kq.commands.features:register"),
    ("chaos", "kq.commands.chaos:register"),
    ("verify", "kq.commands.verify:register"),
    ("log", "kq.commands.log:register"),
    ("produce", "kq.commands.produce:register"),
    ("consume", "kq.commands.consume:register"),
    ("offsets", "kq.commands.offsets:register"),
    ("groups", "kq.commands.groups:register"),
    ("transactions", "kq.commands.transactions:register"),
]
"""Every subcommand: ``(name, "module:function")``, imported only when needed."""

EXIT_UNAVAILABLE = 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kq`` with ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    Bad usage makes argparse print a message and raise ``SystemExit(2)``.
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list)
    args, extras = parser.parse_known_args(args_list)
    func: Handler = args.func
    if extras and not isinstance(func, _Unavailable):
        # Report it with the subcommand's usage, which is where they went wrong.
        _subcommand_parser(parser, args.command).error(
            f"unrecognized arguments: {' '.join(extras)}"
        )
    try:
        status = func(args)
    except KeyboardInterrupt:
        return 130
    return 0 if status is None else int(status)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``kq`` parser, loading only the command that ``argv`` names.

    With ``argv`` None, or naming no command, every command is loaded.
    """
    parser = argparse.ArgumentParser(
        prog="kq", description="kq: a KRaft-style metadata quorum service."
    )
    subparsers = parser.add_subparsers(
        title="commands", dest="command", metavar="COMMAND", required=True
    )
    wanted = _command_name(argv) if argv is not None else None
    for name, target in COMMANDS:
        if wanted is None or name == wanted:
            _register(subparsers, name, target)
        else:
            # Never parsed; only there so that argparse lists every valid
            # choice when ``wanted`` is not one.
            subparsers.add_parser(name)
    return parser


def register_version(subparsers: Subparsers) -> None:
    """Register ``kq version``."""
    parser = subparsers.add_parser(
        "version", help="print kq's version", description="Print kq's version."
    )
    parser.add_argument("--json", action="store_true", help='print {"version": ...} as JSON')
    parser.set_defaults(func=_version)


def _version(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps({"version": __version__}))
    else:
        print(f"kq {__version__}")
    return 0


def _command_name(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first argument that is not an option."""
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg
    return None


def _subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            sub: argparse.ArgumentParser = action.choices[name]
            return sub
    return parser


def _load(target: str) -> Callable[[Subparsers], object]:
    module_name, sep, func_name = target.partition(":")
    if not sep or not module_name or not func_name:
        raise ValueError(f"bad command target {target!r}: expected 'module:function'")
    func = getattr(importlib.import_module(module_name), func_name)
    if not callable(func):
        raise TypeError(f"{target} is not callable")
    return func


def _register(subparsers: Subparsers, name: str, target: str) -> None:
    try:
        _load(target)(subparsers)
    except Exception as exc:
        reason = f"cannot load {target}: {type(exc).__name__}: {exc}"
        _add_unavailable(subparsers, name, reason, traceback.format_exc())
        return
    parser = subparsers.choices.get(name)
    if parser is None:
        _add_unavailable(subparsers, name, f"{target} did not add the subcommand {name!r}")
    elif not callable(parser.get_default("func")):
        _add_unavailable(subparsers, name, f"{target} did not set a func for {name!r}")


def _add_unavailable(subparsers: Subparsers, name: str, reason: str, tb: str = "") -> None:
    """Make ``name`` a command that only reports ``reason``."""
    if name in subparsers.choices:
        # The register function got as far as adding it; replace its parser.
        parser = argparse.ArgumentParser(prog=f"kq {name}", add_help=False)
        subparsers.choices[name] = parser
        for listed in subparsers._choices_actions:
            if listed.dest == name:
                listed.help = f"(unavailable) {reason}"
    else:
        parser = subparsers.add_parser(name, help=f"(unavailable) {reason}", add_help=False)
    parser.add_argument("ignored", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(func=_Unavailable(name, reason, tb))


class _Unavailable:
    """The ``func`` of a command that could not be loaded."""

    def __init__(self, name: str, reason: str, tb: str) -> None:
        self.name = name
        self.reason = reason
        self.tb = tb

    def __call__(self, args: argparse.Namespace) -> int:
        print(f"kq: command {self.name!r} is unavailable: {self.reason}", file=sys.stderr)
        if self.tb and os.environ.get("KQ_DEBUG"):
            print(self.tb, file=sys.stderr, end="")
        elif self.tb:
            print("kq: set KQ_DEBUG=1 for the traceback", file=sys.stderr)
        return EXIT_UNAVAILABLE


if __name__ == "__main__":
    sys.exit(main())
