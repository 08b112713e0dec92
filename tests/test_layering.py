"""The storage seam holds: no module outside ``agentq/storage`` (nor a Lambda handler) calls
DynamoDB's data plane. The import direction between layers is import-linter's contract
(``make layers``, part of ``make lint``, which CI runs); this test covers what an import graph cannot see, a call on a
client handed in from elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "layers" / "agentq" / "python" / "agentq"
DATA_PLANE = re.compile(
    r"\.(get_item|put_item|update_item|delete_item|transact_write_items|transact_get_items|batch_write_item|"
    r"batch_get_item|execute_statement|scan)\("
)


def _offenders(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if DATA_PLANE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_no_dynamodb_data_plane_call_outside_the_storage_package() -> None:
    files = [p for p in PACKAGE.rglob("*.py") if "storage" not in p.relative_to(PACKAGE).parts]
    files += list((ROOT / "functions").rglob("*.py"))
    assert files and _offenders(files) == []


def test_the_check_finds_a_call_where_there_is_one(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f(ddb):\n    return ddb.get_item(TableName='t', Key={})\n")
    good = tmp_path / "good.py"
    good.write_text("def f(store):\n    return store.tasks.get('x')\n")
    assert [line for p in (bad, good) for line in p.read_text().splitlines() if DATA_PLANE.search(line)] == [
        "    return ddb.get_item(TableName='t', Key={})"
    ]
