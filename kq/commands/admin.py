"""Helpers shared by the metadata admin commands (``kq topics``, ``kq configs``, ``kq brokers``,
``kq leader-election``, ``kq reassign``, ``kq features``).

Every such command takes ``--bootstrap H:P[,H:P...]`` (also spelled
``--bootstrap-server``; default: the controllers of the local cluster that
``kq cluster up`` started), ``--timeout SECONDS`` and ``--json``.

Exit statuses: 0 done; 1 refused by the controller (the error's name and
message are printed), or no active controller answered before the deadline;
2 bad usage (malformed flags or files); 3 an indeterminate write: the
request reached a controller but its outcome is unknown, so it may or may
not have been applied.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from kq.commands.common import (
    EXIT_FAILURE,
    EXIT_INDETERMINATE,
    EXIT_USAGE,
    CommandError,
    add_bootstrap_flag,
    bootstrap_addresses,
    client_credentials,
    print_json,
    run_async,
)
from metadata.client import (
    IndeterminateError,
    MetadataClient,
    MetadataClientError,
    NoControllerError,
    PermissionDeniedError,
)
from metadata.errors import Errors

__all__ = [
    "add_common_flags",
    "broker_id",
    "broker_id_list",
    "call",
    "config_list",
    "config_pair",
    "error_name",
    "fail",
    "ids",
    "key_list",
    "linearizable",
    "load_json_file",
    "non_negative_int",
    "positive_int",
    "replica_assignment",
    "usage",
]

T = TypeVar("T")

MAX_ID = 2**31 - 1


def add_common_flags(parser: argparse.ArgumentParser, *, stale: bool = False) -> None:
    """--bootstrap, --cluster-dir, --timeout, --json (and --stale for reads)."""
    add_bootstrap_flag(
        parser, names=("--bootstrap", "--bootstrap-server"), nodes="controllers", of="the cluster"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        help="seconds before giving up (default 5)",
    )
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON")
    if stale:
        parser.add_argument(
            "--stale",
            action="store_true",
            help="let any controller answer from its own metadata, which may lag "
            "(default: the active controller, linearizable)",
        )


def error_name(code: int) -> str:
    """The name of a wire error code."""
    try:
        return Errors(code).name
    except ValueError:
        return f"ERROR_{code}"


def fail(args: argparse.Namespace, code: str, message: str, status: int = EXIT_FAILURE) -> NoReturn:
    """End the command: ``CODE: message`` on stderr (and, with --json, an
    error object on stdout)."""
    if getattr(args, "json", False):
        print_json({"ok": False, "error": code, "message": message})
    raise CommandError(f"{code}: {message}" if message else code, status)


def call(args: argparse.Namespace, use: Callable[[MetadataClient], Awaitable[T]]) -> T:
    """Run ``use`` with a client; map the client's errors to exit statuses."""
    bootstrap = bootstrap_addresses(args)
    if not args.timeout > 0:
        raise CommandError("--timeout must be positive", EXIT_USAGE)

    async def go() -> T:
        credentials = client_credentials(args)
        async with MetadataClient(
            bootstrap, timeout_s=args.timeout, credentials=credentials
        ) as client:
            return await use(client)

    try:
        return run_async(go())
    except IndeterminateError as exc:
        fail(args, "INDETERMINATE", str(exc), EXIT_INDETERMINATE)
    except NoControllerError as exc:
        fail(args, "NO_CONTROLLER", exc.message)
    except MetadataClientError as exc:
        fail(args, exc.code.name, exc.message)
    except PermissionDeniedError as exc:
        fail(args, "PERMISSION_DENIED", str(exc))


def linearizable(args: argparse.Namespace) -> bool:
    return not getattr(args, "stale", False)


# -- argument types (argparse calls them; ArgumentTypeError names the problem) -----


def _int(text: str, what: str, minimum: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} {text!r} is not an integer") from None
    if not minimum <= value <= MAX_ID:
        raise argparse.ArgumentTypeError(f"{what} {value} is outside {minimum}..{MAX_ID}")
    return value


def positive_int(text: str) -> int:
    return _int(text, "value", 1)


def non_negative_int(text: str) -> int:
    return _int(text, "value", 0)


def broker_id(text: str) -> int:
    return _int(text, "broker id", 0)


def broker_id_list(text: str, sep: str = ",") -> list[int]:
    """``1,2,3`` -> [1, 2, 3]: non-empty, no id twice."""
    parts = text.split(sep)
    if not text.strip() or any(not p.strip() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of broker ids like 1{sep}2{sep}3")
    found = [_int(p, "broker id", 0) for p in parts]
    twice = sorted({b for b in found if found.count(b) > 1})
    if twice:
        raise argparse.ArgumentTypeError(
            f"broker {twice[0]} is listed twice in {text!r}"
            if len(twice) == 1
            else f"brokers {ids(twice)} are listed twice in {text!r}"
        )
    return found


def replica_assignment(text: str) -> list[list[int]]:
    """Kafka's ``--replica-assignment``: partitions separated by commas, the
    broker ids of each by colons (``1:2:3,2:3:1``), all with the same number
    of replicas."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the replica assignment is empty")
    partitions: list[list[int]] = []
    for index, part in enumerate(text.split(",")):
        try:
            replicas = broker_id_list(part, ":")
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"partition {index} of {text!r}: {exc}") from None
        if partitions and len(replicas) != len(partitions[0]):
            raise argparse.ArgumentTypeError(
                f"partition {index} of {text!r} has {len(replicas)} replicas, partition 0 "
                f"has {len(partitions[0])}; every partition needs the same number"
            )
        partitions.append(replicas)
    return partitions


def config_pair(text: str) -> tuple[str, str]:
    """``key=value`` (the value may hold any character, '=' included)."""
    key, eq, value = text.partition("=")
    key = key.strip()
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"config {text!r} is not key=value")
    if any(c.isspace() for c in key):
        raise argparse.ArgumentTypeError(f"config key {key!r} contains whitespace")
    return key, value


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside square brackets (kafka-configs.sh's
    ``k1=v1,k2=[a,b]``)."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for c in text:
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise argparse.ArgumentTypeError(f"unbalanced ']' in {text!r}")
        if c == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
    if depth:
        raise argparse.ArgumentTypeError(f"unbalanced '[' in {text!r}")
    parts.append("".join(current))
    return parts


def config_list(text: str) -> list[tuple[str, str]]:
    """kafka-configs.sh's ``--add-config``: ``k1=v1,k2=v2``; a value holding
    commas goes in square brackets (``cleanup.policy=[compact,delete]``)."""
    pairs: list[tuple[str, str]] = []
    for part in _split_top_level(text):
        if not part.strip():
            raise argparse.ArgumentTypeError(f"{text!r} has an empty entry")
        key, value = config_pair(part)
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        pairs.append((key, value))
    return pairs


def key_list(text: str) -> list[str]:
    """``k1,k2``: config keys."""
    keys = [k.strip() for k in text.split(",")]
    if any(not k for k in keys):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of config keys like k1,k2")
    for key in keys:
        if any(c.isspace() for c in key) or "=" in key:
            raise argparse.ArgumentTypeError(f"{key!r} is not a config key")
    return keys


# -- files and output ---------------------------------------------------------------


def load_json_file(path: str, what: str) -> Any:
    """The JSON document in ``path``; a usage error naming the problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CommandError(
            f"cannot read {what} {path}: {exc.strerror or exc}", EXIT_USAGE
        ) from None
    except UnicodeDecodeError:
        raise CommandError(f"{what} {path} is not UTF-8 text", EXIT_USAGE) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(
            f"{what} {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            EXIT_USAGE,
        ) from None


def ids(values: Iterable[int]) -> str:
    """Broker ids as Kafka's tools print them: ``1,2,3``."""
    return ",".join(str(v) for v in values)


def usage(message: str) -> NoReturn:
    raise CommandError(message, EXIT_USAGE)
