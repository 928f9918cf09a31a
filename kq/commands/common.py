"""Helpers shared by the ``kq`` commands (``kq/commands/``): exit statuses, errors, flags, output.

Exit statuses of every such command: 0 success, 1 a definite failure (the
request had no effect, or what was asked for does not exist), 2 bad usage or
configuration, 3 an indeterminate write (it may or may not have committed).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

import grpc

from server.addresses import parse_address, parse_node_id, parse_voters
from server.errors import EXIT_FAILURE, EXIT_INDETERMINATE, EXIT_OK, EXIT_USAGE, UserError

__all__ = [
    "Subparsers",
    "add_command_group",
    "EXIT_FAILURE",
    "EXIT_INDETERMINATE",
    "EXIT_OK",
    "EXIT_USAGE",
    "CommandError",
    "Handler",
    "add_bootstrap_flag",
    "bootstrap_addresses",
    "client_credentials",
    "command",
    "format_fields",
    "format_table",
    "json_bytes",
    "needs_subcommand",
    "parse_address",
    "parse_node_id",
    "parse_voters",
    "print_json",
    "run_async",
]

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What a command's ``register`` function receives, and what a command
group's subcommands are added to."""

Handler = Callable[[argparse.Namespace], int]
T = TypeVar("T")

CommandError = UserError
"""Ends a command with its message on stderr and its exit status; the
libraries under the commands raise the same :class:`server.errors.UserError`."""


def command(name: str) -> Callable[[Handler], Handler]:
    """Wrap a handler: a :class:`CommandError` becomes ``kq NAME: message``
    on stderr and its exit status."""

    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        def run(args: argparse.Namespace) -> int:
            try:
                return handler(args)
            except CommandError as exc:
                print(f"kq {name}: {exc}", file=sys.stderr)
                return exc.status
            except BrokenPipeError:
                # stdout went away (`kq ... | head`): not an error of ours.
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)
                return EXIT_FAILURE

        return run

    return wrap


def add_command_group(
    subparsers: Subparsers, name: str, *, help: str, description: str, title: str | None = None
) -> Subparsers:
    """Add ``kq NAME SUBCOMMAND ...``: a command made of subcommands, which
    are added to what this returns.  Without a subcommand it prints its
    usage and exits 2."""
    parser = subparsers.add_parser(name, help=help, description=description)
    dest = f"{name.replace('-', '_')}_command"
    if title is None:
        commands = parser.add_subparsers(dest=dest, metavar="SUBCOMMAND", required=True)
    else:
        commands = parser.add_subparsers(title=title, dest=dest, metavar="SUBCOMMAND")
    needs_subcommand(parser)
    return commands


def needs_subcommand(parser: argparse.ArgumentParser) -> None:
    """Give a command group (``kq storage``, ...) the ``func`` kq.cli requires;
    argparse itself refuses a missing subcommand first."""

    def usage(args: argparse.Namespace) -> int:
        parser.print_usage(sys.stderr)
        return EXIT_USAGE

    parser.set_defaults(func=usage)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


# -- addresses ----------------------------------------------------------------


def add_bootstrap_flag(
    parser: argparse.ArgumentParser,
    *,
    names: Sequence[str] = ("--bootstrap-server",),
    nodes: str = "nodes",
    of: str = "the quorum",
) -> None:
    """``names`` (``--bootstrap-server`` and any aliases) and --cluster-dir;
    ``nodes`` of ``of`` name what the addresses are in the help."""
    parser.add_argument(
        *names,
        dest="bootstrap_server",
        metavar="H:P[,H:P...]",
        help=f"any {nodes} of {of} (default: the {nodes} of the local cluster "
        "that `kq cluster up` started in --cluster-dir)",
    )
    parser.add_argument(
        "--cluster-dir",
        default="kq-cluster",
        help=f"where to look for the local cluster when {names[0]} is not "
        "given (default: %(default)s)",
    )
    parser.add_argument(
        "--certs-dir",
        metavar="DIR",
        help="speak mutual TLS with the CA and the --user's certificate of this `kq certs` "
        "folder (default: the local cluster's, if it runs with TLS)",
    )
    parser.add_argument(
        "--user",
        default="admin",
        help="whose certificate of --certs-dir to present (user-NAME.crt; default %(default)s)",
    )


def client_credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    """Mutual TLS for a command's client: the ``--certs-dir`` user's
    certificate, else the local cluster's when it runs with TLS (and no
    ``--bootstrap-server`` names another cluster), else plaintext."""
    from quorum.driver.tls import TlsError, TlsFiles

    files: TlsFiles | None = None
    if args.certs_dir is not None:
        files = TlsFiles.in_folder(Path(args.certs_dir), f"user-{args.user}")
    elif args.bootstrap_server is None:
        from server.local_cluster import load_state

        state = load_state(args.cluster_dir)
        files = state.client_tls() if state is not None else None
    if files is None:
        return None
    try:
        return files.channel_credentials()
    except TlsError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None


def bootstrap_addresses(args: argparse.Namespace) -> list[str]:
    """The ``--bootstrap-server`` addresses, or the local cluster's."""
    text: str | None = args.bootstrap_server
    if text is None:
        from server.local_cluster import local_addresses

        addresses = local_addresses(args.cluster_dir)
        if not addresses:
            raise CommandError(
                "--bootstrap-server is required (no local cluster state in "
                f"{args.cluster_dir}/cluster.json)",
                EXIT_USAGE,
            )
        return addresses
    try:
        addresses = [
            parse_address(part, "bootstrap server") for part in text.split(",") if part.strip()
        ]
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    if not addresses:
        raise CommandError("--bootstrap-server names no address", EXIT_USAGE)
    return list(dict.fromkeys(addresses))


# -- RPCs -----------------------------------------------------------------------


# -- output ---------------------------------------------------------------------


def probability(text: str) -> float:
    """An argparse type: a chance in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"needs a number, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


def print_json(obj: object) -> None:
    print(json.dumps(obj, indent=2))


def json_bytes(name: str, data: bytes | None) -> dict[str, Any]:
    """Bytes as a JSON field: ``{name: text}`` when they are UTF-8, else
    ``{name_base64: ...}``; ``{name: None}`` for none."""
    if data is None:
        return {name: None}
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_base64": base64.b64encode(data).decode("ascii")}


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


def format_fields(fields: Mapping[str, object]) -> str:
    """``Name:  value`` lines, values aligned."""
    width = max(len(k) for k in fields) + 2
    return "\n".join(f"{(k + ':').ljust(width)}{v}" for k, v in fields.items())


@contextlib.contextmanager
def pid_file(path: str | None) -> Iterator[None]:
    """Write this process's id to ``path`` (``--pid-file``) while in the
    block, and remove it afterwards if it still names this process."""
    if path is None:
        yield
        return
    file = Path(path)
    try:
        file.write_text(f"{os.getpid()}\n")
    except OSError as exc:
        raise CommandError(f"cannot write --pid-file {path}: {exc}") from None
    try:
        yield
    finally:
        try:
            if file.read_text().strip() == str(os.getpid()):
                file.unlink()
        except OSError:
            pass
