"""``kq kv``: the replicated key-value store of a quorum, from the shell.

kq kv put KEY VALUE            kq kv get KEY [--stale]
kq kv cas KEY EXPECTED NEW     kq kv cas KEY NEW --expect-absent
kq kv delete KEY

with ``--bootstrap-server H:P[,H:P...]`` (default: the local cluster of
``kq cluster up``), ``--json`` and ``--timeout SECONDS``.

Exit statuses: 0 done; 1 a definite failure (nothing was written: the
compare-and-set found another value, no leader was found, the request was
refused; or ``get`` found no value: it prints "not found"); 2 bad usage;
3 an indeterminate write: the request reached a node but its outcome is
unknown, so it may or may not have committed (read the key to find out).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

from kq.commands.common import (
    EXIT_FAILURE,
    EXIT_INDETERMINATE,
    EXIT_USAGE,
    CommandError,
    Subparsers,
    add_bootstrap_flag,
    add_command_group,
    bootstrap_addresses,
    client_credentials,
    command,
    json_bytes,
    print_json,
    run_async,
)
from kvstore.client import KvClient
from quorum.driver.client import ClientError, IndeterminateWriteError
from quorum.types import OffsetAndEpoch

__all__ = ["register"]

T = TypeVar("T")


def register(subparsers: Subparsers) -> None:
    commands = add_command_group(
        subparsers,
        "kv",
        help="put, get, compare-and-set and delete keys of a quorum",
        description=(
            "The quorum's replicated key-value store. Writes go to the leader "
            "(redirects are followed). Exit status: 0 done, 1 definite failure "
            "(nothing written; for get: not found), 2 usage, 3 indeterminate write "
            "(it may or may not have committed)."
        ),
    )

    put = commands.add_parser("put", help="set KEY to VALUE")
    put.add_argument("key")
    put.add_argument("value")
    _common(put)
    put.set_defaults(func=_put)

    get = commands.add_parser(
        "get",
        help="print KEY's value (linearizable, from the leader)",
        description=(
            "Print KEY's value. By default the read is linearizable: the leader "
            "confirms its leadership with a quorum round first. --stale reads any "
            "node's applied state, which may lag."
        ),
    )
    get.add_argument("key")
    get.add_argument("--stale", action="store_true", help="allow a possibly stale read")
    _common(get)
    get.set_defaults(func=_get)

    cas = commands.add_parser(
        "cas",
        help="set KEY to NEW only if it holds EXPECTED (or, --expect-absent, nothing)",
        usage="kq kv cas KEY EXPECTED NEW | kq kv cas KEY NEW --expect-absent",
    )
    cas.add_argument("key")
    cas.add_argument("values", nargs="+", metavar="EXPECTED NEW")
    cas.add_argument(
        "--expect-absent", action="store_true", help="succeed only if KEY has no value"
    )
    _common(cas)
    cas.set_defaults(func=_cas)

    delete = commands.add_parser("delete", help="remove KEY")
    delete.add_argument("key")
    _common(delete)
    delete.set_defaults(func=_delete)


def _common(parser: argparse.ArgumentParser) -> None:
    add_bootstrap_flag(parser)
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON")
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds before giving up (default 5)"
    )


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _call(args: argparse.Namespace, use: Callable[[KvClient], Awaitable[T]]) -> T:
    """Run ``use`` with a client; map client errors to exit statuses."""
    bootstrap = bootstrap_addresses(args)
    if args.timeout <= 0:
        raise CommandError("--timeout must be positive", EXIT_USAGE)

    async def go() -> T:
        credentials = client_credentials(args)
        async with KvClient(bootstrap, timeout_s=args.timeout, credentials=credentials) as client:
            return await use(client)

    try:
        return run_async(go())
    except IndeterminateWriteError as exc:
        _report_error(args, "indeterminate", f"{exc}", EXIT_INDETERMINATE)
    except ClientError as exc:
        _report_error(args, "failed", str(exc), EXIT_FAILURE)


def _report_error(args: argparse.Namespace, kind: str, message: str, status: int) -> NoReturn:
    if kind == "indeterminate" and "may or may not" not in message:
        message += " (the write may or may not have committed)"
    if kind == "indeterminate":
        message += f"; read the key to find out (kq kv get {args.key})"
    if args.json:
        print_json({"ok": False, "error": kind, "message": message})
    raise CommandError(f"{kind}: {message}", status)


def _position(position: OffsetAndEpoch) -> dict[str, int]:
    return {"offset": position.offset, "epoch": position.epoch}


def _written(args: argparse.Namespace, position: OffsetAndEpoch) -> int:
    if args.json:
        print_json({"ok": True, "key": args.key, **_position(position)})
    else:
        print(f"OK (offset {position.offset}, epoch {position.epoch})")
    return 0


@command("kv put")
def _put(args: argparse.Namespace) -> int:
    value = _bytes(args.value)
    position = _call(args, lambda c: c.put(args.key, value))
    return _written(args, position)


@command("kv delete")
def _delete(args: argparse.Namespace) -> int:
    position = _call(args, lambda c: c.delete(args.key))
    return _written(args, position)


@command("kv get")
def _get(args: argparse.Namespace) -> int:
    result = _call(args, lambda c: c.get(args.key, linearizable=not args.stale))
    if args.json:
        out: dict[str, Any] = {
            "ok": result.present,
            "key": args.key,
            "present": result.present,
            "applied_offset": result.applied_offset,
            "node": result.node_address,
        }
        if result.present and result.value is not None:
            out.update(json_bytes("value", result.value))
        if result.version is not None:
            out["version"] = _position(result.version)
        print_json(out)
        return 0 if result.present else EXIT_FAILURE
    if not result.present or result.value is None:
        raise CommandError(f"not found: {args.key}", EXIT_FAILURE)
    sys.stdout.buffer.write(result.value + b"\n")
    sys.stdout.flush()
    return 0


@command("kv cas")
def _cas(args: argparse.Namespace) -> int:
    values: list[str] = args.values
    if args.expect_absent:
        if len(values) != 1:
            raise CommandError("with --expect-absent give KEY NEW", EXIT_USAGE)
        expected: bytes | None = None
        new = _bytes(values[0])
    else:
        if len(values) != 2:
            raise CommandError("give KEY EXPECTED NEW (or KEY NEW --expect-absent)", EXIT_USAGE)
        expected, new = _bytes(values[0]), _bytes(values[1])
    outcome = _call(args, lambda c: c.cas(args.key, expected, new))
    if outcome.ok:
        return _written(args, outcome.position)
    if args.json:
        out: dict[str, Any] = {
            "ok": False,
            "error": "precondition_failed",
            "key": args.key,
            "current_present": outcome.current is not None,
            **_position(outcome.position),
        }
        if outcome.current is not None:
            out.update(json_bytes("current_value", outcome.current))
        print_json(out)
        return EXIT_FAILURE
    found = (
        "the key has no value"
        if outcome.current is None
        else f"it holds {outcome.current.decode('utf-8', 'backslashreplace')!r}"
    )
    raise CommandError(f"precondition failed: {found}; nothing was written", EXIT_FAILURE)
