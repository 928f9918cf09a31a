"""``kq broker start``: run one broker in the foreground.

The broker's settings come from ``--config FILE``, ``KQ_*`` variables and
flags, as a controller's (see :mod:`server.config`): ``node_id``,
``cluster_id``, ``data_dir`` (its copy of the metadata log, formatted with
``kq storage format`` as a controller's), ``voters`` (the controller
quorum), ``listen``, ``[broker]`` (``log_dirs``, ``rack``, intervals),
``[tls]`` and ``[authorizer]``.  It logs to stderr (and ``--log-file``) and
runs until SIGTERM or SIGINT, on which it asks the controller for a
controlled shutdown, waits until it leads nothing, closes its logs and
exits 0.

Exit statuses: 0 a clean stop; 1 the broker could not start (metadata
directory unformatted or of another cluster or node; address in use) or
failed while running; 2 a configuration error.
"""

from __future__ import annotations

import argparse

from kq.commands.common import (
    EXIT_USAGE,
    CommandError,
    Subparsers,
    add_command_group,
    command,
    pid_file,
)
from kq.commands.config_flags import add_config_flags, settings_from_args
from kq.commands.controller import setup_logging
from server.broker import broker_config, run_broker
from server.config import ConfigError

__all__ = ["register"]


def register(subparsers: Subparsers) -> None:
    commands = add_command_group(
        subparsers,
        "broker",
        help="run a broker",
        description="Run a kq broker.",
    )
    start = commands.add_parser(
        "start",
        help="run one broker in the foreground until SIGTERM/SIGINT",
        description=(
            "Run one broker in the foreground. Settings: --config FILE (TOML), then KQ_* "
            "environment variables, then flags (docs/brokers.md lists the broker's keys). "
            "Its data directory (its copy of the metadata log) must have been formatted "
            "with `kq storage format` for this cluster and node id. On SIGTERM or SIGINT "
            "it shuts down under the controller's control, then exits 0."
        ),
    )
    add_config_flags(start)
    start.add_argument("--log-file", metavar="FILE", help="also append the log to FILE")
    start.add_argument("--pid-file", metavar="FILE", help="write the process id to FILE")
    start.set_defaults(func=_start)


@command("broker start")
def _start(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
        config = broker_config(settings)
    except ConfigError as exc:
        raise CommandError(f"config error: {exc}", EXIT_USAGE) from None
    with setup_logging(settings.get("log_level"), args.log_file), pid_file(args.pid_file):
        return run_broker(config)
