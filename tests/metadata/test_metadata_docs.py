"""docs/metadata.md lists every record, config and RPC that exists."""

from __future__ import annotations

import re
from pathlib import Path

from kqproto import metadata_pb2
from metadata.configs import markdown_table
from metadata.records import RecordType

DOC = (Path(__file__).resolve().parents[2] / "docs" / "metadata.md").read_text()


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def test_the_config_table_is_the_generated_one() -> None:
    start = DOC.index("<!-- configs-table-start -->\n") + len("<!-- configs-table-start -->\n")
    end = DOC.index("<!-- configs-table-end -->")
    assert DOC[start:end].strip() == markdown_table().strip(), (
        "regenerate the table in docs/metadata.md from metadata.configs.markdown_table()"
    )


def test_every_record_type_is_documented_with_its_number() -> None:
    rows = {
        int(m.group(1)): m.group(2)
        for m in re.finditer(r"^\| (\d+) \| (\w+) \|", DOC, flags=re.MULTILINE)
    }
    for rtype in RecordType:
        assert rows.get(int(rtype)) == _camel(rtype.name), rtype


def test_every_rpc_is_documented() -> None:
    for service in metadata_pb2.DESCRIPTOR.services_by_name.values():
        assert f"`{service.full_name}`" in DOC, service.full_name
        for method in service.methods:
            assert re.search(rf"\b{method.name}\b", DOC), f"{service.name}.{method.name}"
