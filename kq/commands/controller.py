"""``kq controller start``: run one quorum node in the foreground.

The node's settings come from ``--config FILE``, ``KQ_*`` variables and flags
(see :mod:`server.config`).  It logs to stderr (and ``--log-file``)
and runs until SIGTERM or SIGINT, on which a leader first resigns (so that
the others elect a successor at once instead of waiting for a fetch timeout),
then the node stops and the command exits 0.

Exit statuses: 0 a clean stop; 1 the node could not start (data directory
unformatted, of another cluster or node, corrupt, in use; address in use) or
failed while running; 2 a configuration error.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator

from kq.commands.common import (
    EXIT_USAGE,
    CommandError,
    Subparsers,
    add_command_group,
    command,
    pid_file,
)
from kq.commands.config_flags import add_config_flags, settings_from_args
from server.config import (
    CONTROLLER_LISTENER,
    ConfigError,
    ControllerConfig,
    SecurityProtocol,
    controller_config,
)
from server.controller import run_controller

__all__ = ["register", "setup_logging"]

log = logging.getLogger("kq.controller")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def register(subparsers: Subparsers) -> None:
    commands = add_command_group(
        subparsers,
        "controller",
        help="run a quorum node (controller)",
        description="Run a kq quorum node.",
    )
    start = commands.add_parser(
        "start",
        help="run one node in the foreground until SIGTERM/SIGINT",
        description=(
            "Run one quorum node in the foreground. Settings: --config FILE (TOML), "
            "then KQ_* environment variables, then flags (docs/operations.md lists "
            "every key). The data directory must have been formatted with `kq "
            "storage format` for this cluster and node. On SIGTERM or SIGINT a "
            "leader resigns first, then the node stops and the command exits 0."
        ),
    )
    add_config_flags(start)
    start.add_argument("--log-file", metavar="FILE", help="also append the log to FILE")
    start.add_argument("--pid-file", metavar="FILE", help="write the process id to FILE")
    start.set_defaults(func=_start)


@command("controller start")
def _start(args: argparse.Namespace) -> int:
    try:
        config = controller_config(settings_from_args(args))
    except ConfigError as exc:
        raise CommandError(f"config error: {exc}", EXIT_USAGE) from None
    with setup_logging(config.log_level, args.log_file), pid_file(args.pid_file):
        _log_listener(config)
        return run_controller(config)


PLAINTEXT_WARNING = (
    "listener {name} on {address} is PLAINTEXT: no encryption, no authentication and no "
    "authorization; any caller can act as any node or client. Configure [tls] "
    "(docs/security.md) for SSL"
)


def _log_listener(config: ControllerConfig) -> None:
    """Say which protocol the node serves, on every start (Kafka logs its
    listeners' protocols at startup; a plaintext node warns, as
    CockroachDB's --insecure does)."""
    protocol = config.security_protocol
    if protocol is SecurityProtocol.PLAINTEXT:
        log.warning(PLAINTEXT_WARNING.format(name=CONTROLLER_LISTENER, address=config.address))
    else:
        assert config.tls is not None
        log.info(
            "listener %s on %s is %s: mutual TLS, clients need a certificate of the CA %s",
            CONTROLLER_LISTENER,
            config.address,
            protocol.value,
            config.tls.ca,
        )


@contextlib.contextmanager
def setup_logging(level: str, log_file: str | None) -> Iterator[None]:
    """The root logger at ``level`` to stderr (and ``log_file``) while in
    the block; as it was afterwards."""
    root_level = logging.getLogger().level
    handlers = _setup_logging(level, log_file)
    try:
        yield
    finally:
        for handler in handlers:
            logging.getLogger().removeHandler(handler)
            handler.close()
        logging.getLogger().setLevel(root_level)


def _setup_logging(level: str, log_file: str | None) -> list[logging.Handler]:
    root = logging.getLogger()
    root.setLevel(level)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        try:
            handlers.append(logging.FileHandler(log_file))
        except OSError as exc:
            raise CommandError(f"cannot open --log-file {log_file}: {exc}") from None
    formatter = logging.Formatter(LOG_FORMAT)
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    # gRPC's own loggers are noisy at INFO about normal reconnects.
    logging.getLogger("grpc").setLevel(max(logging.WARNING, root.level))
    return handlers
