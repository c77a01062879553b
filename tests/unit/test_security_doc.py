"""docs/security.md gives the CREATE ROLE and GRANT statements the secured-stack tests run, no more, no less."""

from __future__ import annotations

import re
from pathlib import Path

from stack.secure import ROLES, kafka_acls, keyspace_grants, schema_role_grants

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def _sql_statements() -> list[str]:
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    return [" ".join(line.split()) for block in blocks for line in block.strip().splitlines() if line.strip()]


def test_the_documented_grants_are_the_tested_ones() -> None:
    """Every GRANT in the page is one the tests run, and every one the tests run is in the page."""
    documented = {statement.rstrip(";") for statement in _sql_statements() if statement.startswith("GRANT")}
    tested = {*schema_role_grants("countersink_schema"), *keyspace_grants("countersink")}
    assert documented == tested


def test_the_documented_roles_are_the_tested_ones() -> None:
    """The page creates exactly the roles the secured stack creates, each able to log in."""
    created = [statement for statement in _sql_statements() if statement.startswith("CREATE ROLE")]
    assert sorted(statement.split()[2] for statement in created) == sorted(ROLES)
    assert all("LOGIN = true" in statement for statement in created)


def test_the_documented_kafka_acls_are_the_tested_ones() -> None:
    """The page's kafka-acls commands add exactly the ACLs the secured broker gives countersink's user."""
    blocks = re.findall(r"```sh\n(kafka-acls .*?)```", DOC.read_text(), flags=re.DOTALL)
    assert len(blocks) == 1
    commands = [" ".join(command.replace("\\\n", " ").split()) for command in blocks[0].strip().split("\nkafka-acls")]
    documented = [command.split(" --add ", 1)[1].replace("'", "").split() for command in commands]
    assert documented == [args[1:] for args in kafka_acls(["User:countersink"])]
