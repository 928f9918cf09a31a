"""``kq features``: the cluster's feature levels (kafka-features.sh).

kq features describe   each feature's supported range (what every controller
                       and registered broker supports) and finalized level

With ``--bootstrap``, ``--timeout``, ``--json`` and ``--stale``; exit
statuses: see :mod:`kq.commands.admin`.
"""

from __future__ import annotations

import argparse

from kq.commands.admin import add_common_flags, call, linearizable
from kq.commands.common import Subparsers, add_command_group, command, print_json
from kqproto import metadata_pb2

__all__ = ["feature_lines", "register"]


def register(subparsers: Subparsers) -> None:
    commands = add_command_group(
        subparsers,
        "features",
        help="describe the cluster's feature levels",
        description="The cluster's features (metadata.version, ...), as kafka-features.sh.",
    )

    describe = commands.add_parser(
        "describe",
        help="supported ranges and finalized levels",
        description=(
            "Each feature's supported range (the levels every controller and every "
            "registered broker supports) and its finalized level ('-' if none)."
        ),
    )
    add_common_flags(describe, stale=True)
    describe.set_defaults(func=_describe)


def feature_lines(response: metadata_pb2.DescribeFeaturesResponse) -> list[str]:
    return [
        f"Feature: {f.name}\tSupportedMinVersion: {f.supported_min_version}\t"
        f"SupportedMaxVersion: {f.supported_max_version}\t"
        f"FinalizedVersionLevel: {f.finalized_level if f.finalized_level else '-'}"
        for f in sorted(response.features, key=lambda f: f.name)
    ]


@command("features describe")
def _describe(args: argparse.Namespace) -> int:
    response = call(args, lambda c: c.describe_features(linearizable=linearizable(args)))
    if args.json:
        print_json(
            {
                "features": [
                    {
                        "name": f.name,
                        "supported_min_version": f.supported_min_version,
                        "supported_max_version": f.supported_max_version,
                        "finalized_level": f.finalized_level or None,
                    }
                    for f in sorted(response.features, key=lambda f: f.name)
                ],
                "metadata_offset": response.metadata_offset,
            }
        )
        return 0
    for line in feature_lines(response):
        print(line)
    return 0
