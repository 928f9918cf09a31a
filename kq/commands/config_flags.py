"""The flags that set a node's configuration (``--config FILE``, the
identity flags and ``--set KEY=VALUE``), shared by ``kq controller start``
and ``kq storage format``; the settings themselves are
:mod:`server.config`'s."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from server.config import ConfigError, Settings, load_settings

__all__ = ["add_config_flags", "settings_from_args"]


_FLAG_KEYS = (
    ("node_id", "--node-id"),
    ("cluster_id", "--cluster-id"),
    ("data_dir", "--data-dir"),
    ("listen", "--listen"),
    ("voters", "--voters"),
)


def add_config_flags(
    parser: argparse.ArgumentParser,
    *,
    data_dir_flag: str = "--data-dir",
    keys: Sequence[str] = ("node_id", "cluster_id", "data_dir", "listen", "voters"),
    with_set: bool = True,
) -> None:
    """Add ``--config`` and the override flags of ``keys`` to ``parser``."""
    parser.add_argument("--config", metavar="FILE", help="TOML config file")
    helps = {
        "node_id": "this node's id",
        "cluster_id": "the cluster id (see `kq storage random-cluster-id`)",
        "data_dir": "the node's data directory",
        "listen": "host:port to listen on (default: the node's voter address)",
        "voters": "the voters: 1@host:port,2@host:port,...",
    }
    for key, flag in _FLAG_KEYS:
        if key in keys:
            name = data_dir_flag if key == "data_dir" else flag
            parser.add_argument(name, dest=f"cfg_{key}", metavar=key.upper(), help=helps[key])
    if with_set:
        parser.add_argument(
            "--set",
            dest="cfg_set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="set any config key, e.g. --set quorum.fetch_timeout_ms=3000 (repeatable)",
        )


def settings_from_args(
    args: argparse.Namespace, env: Mapping[str, str] | None = None, data_dir_flag: str = ""
) -> Settings:
    """The settings named by ``args`` (see :func:`add_config_flags`)."""
    flags: list[tuple[str, str, str]] = []
    for key, flag in _FLAG_KEYS:
        text = getattr(args, f"cfg_{key}", None)
        if text is not None:
            name = (data_dir_flag or flag) if key == "data_dir" else flag
            flags.append((key, text, f"flag {name}"))
    for item in getattr(args, "cfg_set", None) or []:
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"flag --set {item!r} is not KEY=VALUE")
        flags.append((key.strip(), text, f"flag --set {item}"))
    return load_settings(args.config, os.environ if env is None else env, flags)
