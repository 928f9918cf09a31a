"""Node ids, ``host:port`` addresses and voter lists as people write them
(in config files, ``KQ_*`` variables and flags): parsed and checked, with a
ValueError that names what is wrong."""

from __future__ import annotations

__all__ = ["parse_address", "parse_node_id", "parse_voters"]


def parse_address(text: str, what: str = "address") -> str:
    """Check ``host:port`` (an IPv6 host in brackets) and return it stripped."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port:
        raise ValueError(f"{what} {text!r} is not host:port")
    if host.startswith("[") != host.endswith("]"):
        raise ValueError(f"{what} {text!r} has an unbalanced IPv6 bracket")
    if any(c.isspace() for c in host) or ("," in host) or ("@" in host):
        raise ValueError(f"{what} {text!r} has a bad host")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"{what} {text!r} has a non-numeric port") from None
    if not 1 <= number <= 65535:
        raise ValueError(f"{what} {text!r} has a port outside 1..65535")
    return f"{host}:{number}"


def parse_voters(text: str, *, bare_ids: bool = False) -> dict[int, str]:
    """Parse ``1@host:port,2@host:port`` into ``{1: "host:port", ...}``.

    With ``bare_ids``, entries may also be plain ids (``1,2,3``); their
    address is then ``""``.
    """
    voters: dict[int, str] = {}
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError("at least one voter is needed")
    for part in parts:
        ident, at, address = part.partition("@")
        if not at and not bare_ids:
            raise ValueError(f"voter {part!r} is not id@host:port")
        node_id = parse_node_id(ident)
        if node_id in voters:
            raise ValueError(f"voter {node_id} is listed twice")
        voters[node_id] = parse_address(address, f"the address of voter {node_id}") if at else ""
    return voters


def parse_node_id(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not a node id") from None
    if value < 0 or value > 2**31 - 1:
        raise ValueError(f"node id {value} is outside 0..2147483647")
    return value
