"""The configuration of a kq controller: a TOML file, ``KQ_*`` variables, flags.

Every setting has a dotted key (``node_id``, ``quorum.fetch_timeout_ms``,
``node.append_linger_ms``).  Sources, later ones winning:

1. defaults (:data:`SETTINGS`);
2. the TOML config file (``--config FILE``): top-level keys, and the tables
   ``[voters]``, ``[quorum]``, ``[node]`` and ``[controller]``;
3. environment variables ``KQ_<KEY>``: the key upper-cased with dots as
   underscores (``KQ_NODE_ID``, ``KQ_QUORUM_FETCH_TIMEOUT_MS``);
4. flags: ``--node-id``, ``--cluster-id``, ``--data-dir``, ``--listen``,
   ``--voters``, then every ``--set KEY=VALUE`` in order.

An unknown key or a bad value from any source is a :class:`ConfigError`
naming the key and where it came from; commands exit 2 on it.  A relative
``data_dir`` from the config file is relative to the file's directory; from
the environment or a flag, to the working directory.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from broker.group.shard import GroupConfig
from broker.group_coordinator import OffsetsTopicSettings
from broker.txn.coordinator import TxnConfig
from broker.txn_coordinator import TransactionStateTopicSettings
from metadata.active import ControllerSettings
from metadata.authorizer import AuthorizerSettings
from quorum.config import QuorumConfig
from quorum.driver.node import NodeOptions
from quorum.driver.server import NodeConfig
from quorum.driver.tls import TlsFiles
from server.addresses import parse_address, parse_node_id, parse_voters

__all__ = [
    "IGNORED_ENV",
    "LOG_LEVELS",
    "SETTINGS",
    "CONTROLLER_LISTENER",
    "ConfigError",
    "ControllerConfig",
    "SecurityProtocol",
    "Setting",
    "Settings",
    "controller_config",
    "env_name",
    "load_settings",
    "parse_protocol_map",
    "render_toml",
]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# KQ_* variables that are not configuration: kq's own debugging switches, and
# the process-wide switches of the quorum driver (quorum.driver.transport,
# quorum.driver.loop).
IGNORED_ENV = frozenset(
    {
        "KQ_DEBUG",
        "KQ_REWRITE",
        "KQ_FETCH_STREAM",
        "KQ_UVLOOP",
        # The deliberate bugs' switch (bugs, server.injected_bugs).
        "KQ_INJECT_BUGS",
        "KQ_INJECT_BUGS_ACK",
        # The power-loss test mode of the storage (server.storage_mode).
        "KQ_LOSE_UNSYNCED",
        # The Spark driver's memory of a verification (spark_verify.session),
        # inherited by the nodes a catalogue or `kq chaos run --verify` starts.
        "KQ_SPARK_DRIVER_MEMORY",
    }
)


class ConfigError(Exception):
    """A bad configuration: unknown key, bad value, missing setting."""


class SecurityProtocol(enum.Enum):
    """A listener's security protocol, as Kafka names them
    (``org.apache.kafka.common.security.auth.SecurityProtocol``); kq has no
    SASL, so only these two."""

    PLAINTEXT = "PLAINTEXT"  # no encryption, no authentication
    SSL = "SSL"  # mutual TLS: the [tls] section's CA and certificate


CONTROLLER_LISTENER = "CONTROLLER"
"""The name of a controller's listener (Kafka's ``controller.listener.names``
default in KRaft quick starts).  A broker's listeners will add names."""
_KAFKA_ONLY_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
_LISTENER_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


@dataclass(frozen=True, slots=True)
class Setting:
    key: str
    # int, float, str (a cluster id), path, address, voters, level
    kind: str
    default: object
    doc: str
    minimum: float | None = None


def _core_settings(
    section: str,
    cls: type[Any],
    skip: Iterable[str] = (),
    minimums: Mapping[str, float] | None = None,
) -> list[Setting]:
    """The int, float and bool fields of a settings dataclass, with its
    defaults."""
    minimums = minimums or {}
    out = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind = "float" if f.type in ("float", float) else "int"
        if f.type in ("bool", bool):
            kind = "bool"
        default = f.default
        assert default is not dataclasses.MISSING, f"{cls.__name__}.{f.name} has no plain default"
        out.append(
            Setting(
                f"{section}.{f.name}",
                kind,
                default,
                f"see {cls.__module__}.{cls.__name__}",
                minimums.get(f.name, 0),
            )
        )
    return out


_TOP = [
    Setting("node_id", "int", None, "this node's id (required)", 0),
    Setting("cluster_id", "str", None, "the cluster's id (required)"),
    Setting("data_dir", "path", None, "the formatted data directory (required)"),
    Setting("voters", "voters", None, "voter id -> host:port (required)"),
    Setting("listen", "address", "", "host:port to listen on (default: own voter address)"),
    Setting("metrics_listen", "address", "", "host:port of the Prometheus exporter"),
    Setting("log_level", "level", "INFO", "DEBUG, INFO, WARNING, ERROR or CRITICAL"),
    Setting(
        "listener_security_protocol_map",
        "protocols",
        None,
        "listener name -> security protocol, as Kafka's listener.security.protocol.map "
        '("CONTROLLER:SSL"; default: SSL with [tls], else PLAINTEXT)',
    ),
]

_TLS = [
    Setting("tls.ca_file", "path", None, "the cluster's CA certificate (PEM)"),
    Setting("tls.cert_file", "path", None, "this node's certificate (PEM)"),
    Setting("tls.key_file", "path", None, "this node's private key (PEM)"),
]

# Kafka's super.users and allow.everyone.if.no.acl.found (docs/security.md).
_AUTHORIZER = [
    Setting(
        "authorizer.super_users",
        "principals",
        (),
        'principals allowed everything, e.g. ["User:admin"] (or "User:a,User:b")',
    ),
    Setting(
        "authorizer.allow_everyone_if_no_acl_found",
        "bool",
        False,
        "allow a resource that has no ACL at all to everyone",
    ),
]

# A broker's own keys (kq broker start); node_id, cluster_id, data_dir (the
# broker's copy of the metadata log), voters (the controller quorum),
# listen, [tls] and [authorizer] are shared with the controllers.
_BROKER = [
    Setting(
        "broker.log_dirs",
        "paths",
        None,
        'the partition logs\' directories, e.g. ["/var/lib/kq/logs"] (required for a broker)',
    ),
    Setting("broker.rack", "str", None, "the broker's rack (replica placement spreads racks)"),
    Setting("broker.heartbeat_interval_ms", "int", 500, "between heartbeats to the controller", 1),
    Setting(
        "broker.tick_interval_ms",
        "int",
        250,
        "between runs of the ISR expiration and the log manager's tasks",
        1,
    ),
    Setting(
        "broker.log_retention_check_interval_ms",
        "int",
        300_000,
        "between retention checks of every log (Kafka's log.retention.check.interval.ms)",
        1,
    ),
    Setting(
        "broker.controlled_shutdown_timeout_ms",
        "int",
        30_000,
        "how long a stopping broker waits for the controller to move its leaders away",
        0,
    ),
]

SETTINGS: dict[str, Setting] = {
    s.key: s
    for s in _TOP
    + _TLS
    + _AUTHORIZER
    + _BROKER
    + _core_settings("quorum", QuorumConfig, minimums={"check_quorum_factor": 1.0})
    + _core_settings("node", NodeOptions, skip=("quorum",), minimums={"max_batch_records": 1})
    + _core_settings(
        "group",
        GroupConfig,
        skip=("assignors",),
        minimums={
            "session_timeout_ms": 1,
            "heartbeat_interval_ms": 1,
            "max_size": 1,
            "offset_metadata_max_bytes": 0,
            "offsets_retention_ms": 1,
            "offsets_retention_check_interval_ms": 1,
        },
    )
    + _core_settings(
        "offsets",
        OffsetsTopicSettings,
        minimums={
            "partitions": 1,
            "replication_factor": 1,
            "min_insync_replicas": 1,
            "segment_bytes": 14,
            "commit_timeout_ms": 1,
            "tick_interval_ms": 1,
        },
    )
    + _core_settings(
        "transaction_state",
        TransactionStateTopicSettings,
        minimums={
            "partitions": 1,
            "replication_factor": 1,
            "min_insync_replicas": 1,
            "segment_bytes": 14,
            "commit_timeout_ms": 1,
            "tick_interval_ms": 1,
        },
    )
    + _core_settings(
        "transaction",
        TxnConfig,
        minimums={"max_timeout_ms": 1, "transactional_id_expiration_ms": 1},
    )
    + _core_settings(
        "controller",
        ControllerSettings,
        minimums={
            "broker_session_timeout_ms": 1,
            "broker_heartbeat_interval_ms": 1,
            "tick_interval_ms": 1,
        },
    )
}
"""Every setting, by key."""

_SECTIONS = (
    "quorum",
    "node",
    "controller",
    "tls",
    "authorizer",
    "broker",
    "group",
    "offsets",
    "transaction",
    "transaction_state",
)


def env_name(key: str) -> str:
    """The environment variable of a key: ``quorum.fetch_timeout_ms`` ->
    ``KQ_QUORUM_FETCH_TIMEOUT_MS``."""
    return "KQ_" + key.upper().replace(".", "_")


_ENV_KEYS = {env_name(key): key for key in SETTINGS}


@dataclass(slots=True)
class Settings:
    """Values by key, and where each came from (``"default"``, ``"config file
    X"``, ``"environment variable KQ_..."``, ``"flag --..."``)."""

    values: dict[str, object] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    config_file: Path | None = None

    def get(self, key: str) -> Any:
        return self.values.get(key, SETTINGS[key].default)

    def origin(self, key: str) -> str:
        return self.origins.get(key, "default")

    def require(self, key: str, flag: str = "") -> Any:
        value = self.get(key)
        if value is None:
            how = [f"`{key}` in the config file", env_name(key)]
            how.append(flag or f"--set {key}=...")
            raise ConfigError(f"missing required setting {key!r} (set {' or '.join(how)})")
        return value

    def set(self, key: str, value: object, origin: str) -> None:
        self.values[key] = value
        self.origins[key] = origin


# -- conversion -------------------------------------------------------------------


def _bad(key: str, origin: str, why: str) -> ConfigError:
    return ConfigError(f"bad value for {key!r} from {origin}: {why}")


def _convert(
    setting: Setting, raw: object, origin: str, *, typed: bool, base_dir: Path | None = None
) -> object:
    """Check and convert ``raw`` (a TOML value when ``typed``, else text)."""
    key, kind = setting.key, setting.kind
    if kind == "voters":
        return _convert_voters(key, raw, origin)
    if kind == "protocols":
        if not isinstance(raw, str):
            return _fail_type(key, origin, "string", raw)
        try:
            return parse_protocol_map(raw)
        except ValueError as exc:
            raise _bad(key, origin, str(exc)) from None
    if kind == "principals":
        return _convert_principals(key, raw, origin)
    if kind == "paths":
        return _convert_paths(key, raw, origin, base_dir)
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        if not typed and isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        return _fail_type(key, origin, "boolean (true or false)", raw)
    if kind in ("int", "float"):
        if typed:
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                return _fail_type(key, origin, kind, raw)
            if kind == "int" and not isinstance(raw, int):
                return _fail_type(key, origin, kind, raw)
            number: float = raw
        else:
            assert isinstance(raw, str)
            try:
                number = int(raw.strip()) if kind == "int" else float(raw.strip())
            except ValueError:
                return _fail_type(key, origin, kind, raw)
        if not math.isfinite(number):
            raise _bad(key, origin, f"expected a finite number, got {raw!r}")
        if setting.minimum is not None and number < setting.minimum:
            raise _bad(key, origin, f"must be at least {setting.minimum:g}, got {raw!r}")
        if key == "node_id" and number > 2**31 - 1:
            raise _bad(key, origin, f"must be at most 2147483647, got {raw!r}")
        return float(number) if kind == "float" else int(number)
    if not isinstance(raw, str):
        return _fail_type(key, origin, "string", raw)
    text = raw.strip()
    if kind == "str":
        if not text or not text.isascii() or not text.isprintable() or " " in text:
            raise _bad(key, origin, f"expected printable ASCII without spaces, got {raw!r}")
        return text
    if kind == "path":
        if not text:
            raise _bad(key, origin, "expected a directory path, got an empty string")
        path = Path(text).expanduser()
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        return path
    if kind == "address":
        if not text:
            return ""
        try:
            return parse_address(text)
        except ValueError as exc:
            raise _bad(key, origin, str(exc)) from None
    if kind == "level":
        if text.upper() not in LOG_LEVELS:
            raise _bad(key, origin, f"expected one of {', '.join(LOG_LEVELS)}, got {raw!r}")
        return text.upper()
    raise AssertionError(f"unknown kind {kind}")  # pragma: no cover


def _fail_type(key: str, origin: str, kind: str, raw: object) -> NoReturn:
    name = {"int": "integer", "float": "number"}.get(kind, kind)
    article = "an" if name[0] in "aeiou" else "a"
    shown = repr(raw) if isinstance(raw, str) else f"{type(raw).__name__} {raw!r}"
    raise _bad(key, origin, f"expected {article} {name}, got {shown}")


def parse_protocol_map(text: str) -> dict[str, SecurityProtocol]:
    """``"NAME:PROTOCOL,..."`` (Kafka's ``listener.security.protocol.map``
    syntax) as listener names to protocols; :class:`ValueError` naming the
    bad entry."""
    out: dict[str, SecurityProtocol] = {}
    for entry in text.split(","):
        name, colon, protocol = (part.strip() for part in entry.strip().partition(":"))
        if not colon or not name or not protocol:
            raise ValueError(f"expected NAME:PROTOCOL entries separated by commas, got {entry!r}")
        if not _LISTENER_NAME.fullmatch(name):
            raise ValueError(f"listener name {name!r} must be upper case letters, digits and _")
        if name in out:
            raise ValueError(f"listener {name} is named twice")
        if protocol in _KAFKA_ONLY_PROTOCOLS:
            raise ValueError(f"{protocol} (listener {name}) is Kafka's; kq has PLAINTEXT and SSL")
        try:
            out[name] = SecurityProtocol(protocol)
        except ValueError:
            raise ValueError(
                f"unknown security protocol {protocol!r} for listener {name} (PLAINTEXT or SSL)"
            ) from None
    return out


def _convert_principals(key: str, raw: object, origin: str) -> tuple[str, ...]:
    """A TOML list of principals, or their text separated by commas."""
    if isinstance(raw, str):
        items = [p.strip() for p in raw.split(",") if p.strip()]
    elif isinstance(raw, list) and all(isinstance(p, str) for p in raw):
        items = [p.strip() for p in raw]
    else:
        return _fail_type(key, origin, "list of principals", raw)
    try:
        AuthorizerSettings(frozenset(items))
    except ValueError as exc:
        raise _bad(key, origin, str(exc)) from None
    return tuple(items)


def _convert_paths(key: str, raw: object, origin: str, base_dir: Path | None) -> tuple[Path, ...]:
    """Directories: a TOML array of strings, or comma-separated text."""
    if isinstance(raw, str):
        items: list[object] = [part for part in raw.split(",") if part.strip()]
    elif isinstance(raw, list):
        items = list(raw)
    else:
        return _fail_type(key, origin, "array of directory paths", raw)
    if not items or not all(isinstance(item, str) and item.strip() for item in items):
        raise _bad(key, origin, f"expected one or more directory paths, got {raw!r}")
    paths = []
    for item in items:
        assert isinstance(item, str)
        path = Path(item.strip()).expanduser()
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        paths.append(path)
    if len(set(paths)) != len(paths):
        raise _bad(key, origin, f"a directory is listed twice: {raw!r}")
    return tuple(paths)


def _convert_voters(key: str, raw: object, origin: str) -> dict[int, str]:
    try:
        if isinstance(raw, str):
            return parse_voters(raw, bare_ids=True)
        if isinstance(raw, dict):
            voters: dict[int, str] = {}
            for ident, address in raw.items():
                node_id = parse_node_id(str(ident))
                if not isinstance(address, str):
                    raise ValueError(f"the address of voter {node_id} must be a host:port string")
                voters[node_id] = parse_address(address, f"the address of voter {node_id}")
            if not voters:
                raise ValueError("at least one voter is needed")
            return voters
    except ValueError as exc:
        raise _bad(key, origin, str(exc)) from None
    raise _bad(
        key, origin, f'expected a table or a "1@host:port,..." string, got {type(raw).__name__}'
    )


# -- sources --------------------------------------------------------------------


def _read_file(path: Path, settings: Settings) -> None:
    origin = f"config file {path}"
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    base = path.parent
    for name, value in doc.items():
        if name in _SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{name!r} in {origin} must be a table ([{name}])")
            for sub, subvalue in value.items():
                _set_typed(settings, f"{name}.{sub}", subvalue, origin, base)
        else:
            _set_typed(settings, name, value, origin, base)


def _set_typed(settings: Settings, key: str, value: object, origin: str, base: Path) -> None:
    setting = SETTINGS.get(key)
    if setting is None:
        raise ConfigError(f"unknown key {key!r} in {origin}{_suggest(key)}")
    settings.set(key, _convert(setting, value, origin, typed=True, base_dir=base), origin)


def _suggest(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, SETTINGS, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _read_env(env: Mapping[str, str], settings: Settings) -> None:
    for name in sorted(env):
        if not name.startswith("KQ_") or name in IGNORED_ENV:
            continue
        key = _ENV_KEYS.get(name)
        origin = f"environment variable {name}"
        if key is None:
            guess = _suggest(name[3:].lower().replace("_", "."))
            raise ConfigError(
                f"unknown key in {origin}: no setting is named {name}{guess}; "
                "unset it (KQ_* variables configure kq)"
            )
        settings.set(key, _convert(SETTINGS[key], env[name], origin, typed=False), origin)


def load_settings(
    config_file: str | os.PathLike[str] | None,
    env: Mapping[str, str],
    flags: Sequence[tuple[str, str, str]] = (),
) -> Settings:
    """Merge defaults < file < environment < ``flags``.

    ``flags`` are ``(key, text, origin)``, applied in order.
    """
    settings = Settings()
    if config_file is not None:
        settings.config_file = Path(config_file)
        _read_file(settings.config_file, settings)
    _read_env(env, settings)
    for key, text, origin in flags:
        setting = SETTINGS.get(key)
        if setting is None:
            raise ConfigError(f"unknown key {key!r} in {origin}{_suggest(key)}")
        settings.set(key, _convert(setting, text, origin, typed=False), origin)
    return settings


# -- the controller's configuration --------------------------------------------------


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    node_id: int
    cluster_id: str
    data_dir: Path
    voters: Mapping[int, str]
    listen: str
    metrics_listen: str
    log_level: str
    options: NodeOptions
    settings: Settings
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    # Mutual TLS (the [tls] section); None: plaintext.
    tls: TlsFiles | None = None
    # The [authorizer] section: who is a super user; the default without ACLs.
    authorizer: AuthorizerSettings = field(default_factory=AuthorizerSettings)
    # Each listener's security protocol (listener_security_protocol_map,
    # checked against [tls]); a controller has one, CONTROLLER.
    listeners: Mapping[str, SecurityProtocol] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return self.listen or self.voters[self.node_id]

    @property
    def security_protocol(self) -> SecurityProtocol:
        """The protocol of the node's listener (SSL exactly when [tls] is set)."""
        derived = SecurityProtocol.SSL if self.tls is not None else SecurityProtocol.PLAINTEXT
        return self.listeners.get(CONTROLLER_LISTENER, derived)

    def node_config(self) -> NodeConfig:
        return NodeConfig(
            node_id=self.node_id,
            cluster_id=self.cluster_id,
            voters=dict(self.voters),
            data_dir=self.data_dir,
            listen=self.listen,
            options=self.options,
            metrics_listen=self.metrics_listen,
            tls=self.tls,
        )


def controller_config(settings: Settings) -> ControllerConfig:
    """Check that ``settings`` make a runnable node."""
    node_id: int = settings.require("node_id", "--node-id")
    cluster_id: str = settings.require("cluster_id", "--cluster-id")
    data_dir: Path = settings.require("data_dir", "--data-dir")
    voters: dict[int, str] = settings.require("voters", "--voters")
    listen: str = settings.get("listen")
    missing = [v for v, address in sorted(voters.items()) if not address]
    if missing:
        raise ConfigError(
            f"bad value for 'voters' from {settings.origin('voters')}: voter(s) "
            f"{', '.join(map(str, missing))} have no address (use id@host:port)"
        )
    if node_id not in voters and not listen:
        raise ConfigError(
            f"node {node_id} (from {settings.origin('node_id')}) is not a voter "
            f"({', '.join(map(str, sorted(voters)))}) and has no 'listen' address"
        )
    quorum_values = {
        key.partition(".")[2]: settings.get(key) for key in SETTINGS if key.startswith("quorum.")
    }
    try:
        quorum = QuorumConfig(**quorum_values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(_blame("quorum", str(exc), settings)) from None
    node_values = {
        key.partition(".")[2]: settings.get(key) for key in SETTINGS if key.startswith("node.")
    }
    try:
        options = NodeOptions(quorum=quorum, **node_values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(_blame("node", str(exc), settings)) from None
    controller_values = {
        key.partition(".")[2]: settings.get(key)
        for key in SETTINGS
        if key.startswith("controller.")
    }
    try:
        controller = ControllerSettings(**controller_values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(_blame("controller", str(exc), settings)) from None
    tls = _tls_files(settings)
    return ControllerConfig(
        node_id=node_id,
        cluster_id=cluster_id,
        data_dir=data_dir,
        voters=voters,
        listen=listen,
        metrics_listen=settings.get("metrics_listen"),
        log_level=settings.get("log_level"),
        options=options,
        settings=settings,
        controller=controller,
        tls=tls,
        authorizer=AuthorizerSettings(
            frozenset(settings.get("authorizer.super_users")),
            settings.get("authorizer.allow_everyone_if_no_acl_found"),
        ),
        listeners=_listeners(settings, tls),
    )


def _tls_files(settings: Settings) -> TlsFiles | None:
    """The [tls] section: all three files, or none (plaintext)."""
    keys = [s.key for s in _TLS]
    given = {key: settings.get(key) for key in keys}
    if all(path is None for path in given.values()):
        return None
    missing = [key for key, path in given.items() if path is None]
    if missing:
        set_ = ", ".join(f"{k} (from {settings.origin(k)})" for k in keys if k not in missing)
        raise ConfigError(
            f"TLS needs tls.ca_file, tls.cert_file and tls.key_file together: "
            f"{', '.join(missing)} missing where {set_} given"
        )
    return TlsFiles(given["tls.ca_file"], given["tls.cert_file"], given["tls.key_file"])


def _listeners(settings: Settings, tls: TlsFiles | None) -> dict[str, SecurityProtocol]:
    """The listeners' protocols: the map as given, checked against [tls]
    (an SSL listener needs its files, a PLAINTEXT one must not have them:
    a node serves one protocol), or derived from [tls] when not given, as
    configs from before the setting mean."""
    key = "listener_security_protocol_map"
    derived = SecurityProtocol.SSL if tls is not None else SecurityProtocol.PLAINTEXT
    given: dict[str, SecurityProtocol] | None = settings.get(key)
    if given is None:
        return {CONTROLLER_LISTENER: derived}
    where = f"{key} (from {settings.origin(key)})"
    others = sorted(set(given) - {CONTROLLER_LISTENER})
    if others:
        raise ConfigError(
            f"{where} names listener(s) {', '.join(others)}; a controller has one listener, "
            f"{CONTROLLER_LISTENER}"
        )
    # Not empty (the syntax needs an entry) and no other name: CONTROLLER.
    protocol = given[CONTROLLER_LISTENER]
    if protocol is not derived:
        tls_keys = ", ".join(s.key for s in _TLS)
        if protocol is SecurityProtocol.SSL:
            raise ConfigError(
                f"{where} makes {CONTROLLER_LISTENER} SSL, but the [tls] section ({tls_keys}) "
                "is not set: SSL needs the CA, certificate and key files"
            )
        origins = ", ".join(sorted({settings.origin(s.key) for s in _TLS}))
        raise ConfigError(
            f"{where} makes {CONTROLLER_LISTENER} PLAINTEXT, but the [tls] section "
            f"({tls_keys}, from {origins}) is set: remove one or make it SSL"
        )
    return dict(given)


def _blame(section: str, message: str, settings: Settings) -> str:
    """Name the keys a cross-field check mentions, and where each came from."""
    keys = [
        key
        for key in SETTINGS
        if key.startswith(section + ".")
        and re.search(rf"\b{re.escape(key.partition('.')[2])}\b", message)
    ]
    where = "; ".join(f"{key} from {settings.origin(key)}" for key in keys)
    return f"bad [{section}] settings: {message}" + (f" ({where})" if where else "")


def _protocol_name(protocol: object) -> str:
    return protocol.value if isinstance(protocol, SecurityProtocol) else str(protocol)


# -- writing ----------------------------------------------------------------------


def render_toml(values: Mapping[str, object]) -> str:
    """A config file holding ``values`` (keys as in :data:`SETTINGS`)."""
    top: list[str] = []
    tables: dict[str, list[str]] = {"voters": [], **{s: [] for s in _SECTIONS}}
    for key, value in values.items():
        if key not in SETTINGS:
            raise ConfigError(f"unknown key {key!r}")
        if key == "voters":
            assert isinstance(value, Mapping)
            tables["voters"] = [f"{k} = {_toml_value(v)}" for k, v in sorted(value.items())]
            continue
        section, dot, name = key.partition(".")
        if dot:
            tables[section].append(f"{name} = {_toml_value(value)}")
        else:
            top.append(f"{key} = {_toml_value(value)}")
    out = top[:]
    for name, lines in tables.items():
        if lines:
            out += ["", f"[{name}]", *lines]
    return "\n".join(out) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, Mapping):  # listener_security_protocol_map
        text = ",".join(f"{name}:{_protocol_name(p)}" for name, p in value.items())
        return _toml_value(text)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (tuple, list)):  # authorizer.super_users
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    text = str(value)
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
