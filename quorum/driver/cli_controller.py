"""``kq controller start``: run one quorum node in the foreground.

The node's settings come from ``--config FILE``, ``KQ_*`` variables and flags
(see :mod:`quorum.driver.cli_config`).  It logs to stderr (and ``--log-file``)
and runs until SIGTERM or SIGINT, on which a leader first resigns (so that
the others elect a successor at once instead of waiting for a fetch timeout),
then the node stops and the command exits 0.

Exit statuses: 0 a clean stop; 1 the node could not start (data directory
unformatted, of another cluster or node, corrupt, in use; address in use) or
failed while running; 2 a configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from quorum.driver.cli_common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    CommandError,
    command,
    needs_subcommand,
)
from quorum.driver.cli_config import (
    ConfigError,
    ControllerConfig,
    add_config_flags,
    controller_config,
    settings_from_args,
)
from quorum.driver.rocks import StorageOpenError
from quorum.driver.storage_format import StorageFormatError, read_meta
from quorum.storage import StorageCorruptError
from quorum.types import Role
from server.controller import controller_server

__all__ = ["register", "run_controller"]

log = logging.getLogger("kq.controller")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "controller",
        help="run a quorum node (controller)",
        description="Run a kq quorum node.",
    )
    commands = parser.add_subparsers(dest="controller_command", metavar="SUBCOMMAND", required=True)
    needs_subcommand(parser)
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
    root_level = logging.getLogger().level
    handlers = _setup_logging(config.log_level, args.log_file)
    pid_file = Path(args.pid_file) if args.pid_file else None
    try:
        if pid_file is not None:
            try:
                pid_file.write_text(f"{os.getpid()}\n")
            except OSError as exc:
                pid_file = None
                raise CommandError(f"cannot write --pid-file {args.pid_file}: {exc}") from None
        return run_controller(config)
    finally:
        if pid_file is not None:
            try:
                if pid_file.read_text().strip() == str(os.getpid()):
                    pid_file.unlink()
            except OSError:
                pass
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


def run_controller(config: ControllerConfig) -> int:
    """Open the node's storage, serve until a signal, stop; the exit status."""
    where = config.settings.config_file
    log.info(
        "starting node %d of cluster %s: data dir %s, address %s, voters %s%s",
        config.node_id,
        config.cluster_id,
        config.data_dir,
        config.address,
        ",".join(f"{n}@{a}" for n, a in sorted(config.voters.items())),
        f"; config file {where}" if where else "",
    )
    try:
        meta = read_meta(config.data_dir)
    except StorageFormatError as exc:
        log.error("cannot start node %d: %s", config.node_id, exc)
        return EXIT_FAILURE
    if meta.cluster_id == config.cluster_id and set(meta.voters.voters) != set(config.voters):
        log.error(
            "cannot start node %d: data directory %s was formatted for voters %s but the "
            "configuration names voters %s; refusing to start (the voter set cannot change "
            "by editing the configuration)",
            config.node_id,
            config.data_dir,
            ",".join(map(str, meta.voters.sorted())),
            ",".join(map(str, sorted(config.voters))),
        )
        return EXIT_FAILURE
    return asyncio.run(_serve(config))


async def _serve(config: ControllerConfig) -> int:
    node_id = config.node_id
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    received: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        if received:
            log.warning("received %s again; already stopping", sig.name)
            return
        received.append(sig.name)
        log.info("received %s: resigning leadership if leader, then stopping", sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        try:
            # The gRPC server of a NodeServer belongs to the loop it is made in.
            server = controller_server(config.node_config(), config.controller)
        except (
            StorageFormatError,
            StorageCorruptError,
            StorageOpenError,
            OSError,
            ValueError,
        ) as exc:
            log.error("cannot start node %d: %s", node_id, exc)
            return EXIT_FAILURE
        try:
            await server.start()
        except (OSError, RuntimeError) as exc:
            log.error("cannot start node %d on %s: %s", node_id, config.address, exc)
            await server.server.stop(grace=None)
            close = getattr(server.storage, "close", None)
            if close is not None:
                close()
            return EXIT_FAILURE
        status = 0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
            if server.node.failure is not None:
                log.error("node %d failed: %s; stopping", node_id, server.node.failure)
                status = EXIT_FAILURE
                break
        core = server.node.core
        if status == 0 and core.role is Role.LEADER:
            log.info("node %d leads epoch %d: resigning before it stops", node_id, core.epoch)
        await server.stop(resign=status == 0)
        if status == 0:
            log.info("node %d stopped cleanly", node_id)
        return status
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
