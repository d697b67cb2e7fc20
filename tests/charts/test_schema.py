"""values.schema.json: covers every value in values.yaml and refuses bad values with a message naming them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from .conftest import CHART, helm

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = SCHEMA["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return node


def leaves(value: Any, schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """(path, schema node) for every key of `value`; None where the schema has no named property for it."""
    schema = resolve(schema)
    if not isinstance(value, dict) or "properties" not in schema:
        yield path, schema
        return
    for key, sub in value.items():
        node = schema["properties"].get(key)
        if node is None:
            yield f"{path}.{key}", None
        else:
            yield from leaves(sub, node, f"{path}.{key}")


def test_every_value_in_values_yaml_has_a_described_schema_property() -> None:
    missing = [p for p, node in leaves(VALUES, SCHEMA, "") if node is None or "type" not in resolve(node)]
    assert not missing, f"values without a typed schema property: {missing}"


def test_every_schema_property_is_a_value_and_objects_refuse_unknown_keys() -> None:
    def walk(node: dict[str, Any], value: Any, path: str) -> Iterator[str]:
        node = resolve(node)
        if "properties" in node:
            if node.get("additionalProperties") is not False:
                yield f"{path}: additionalProperties is not false"
            for key, sub in node["properties"].items():
                if key == "global":
                    continue
                if not isinstance(value, dict) or key not in value:
                    yield f"{path}.{key}: in the schema but not in values.yaml"
                else:
                    yield from walk(sub, value[key], f"{path}.{key}")

    problems = list(walk(SCHEMA, VALUES, ""))
    assert not problems, problems


BAD = [
    (["coordinator.ports.grpc=abc"], "at '/coordinator/ports/grpc': got string, want integer"),
    (["coordinator.replica=2"], "at '/coordinator': additional properties 'replica' not allowed"),
    (["timeSlicing.replicas.rollout=-1"], "at '/timeSlicing/replicas/rollout': minimum: got -1, want 1"),
    (["sidecar.socketGroup=0"], "at '/sidecar/socketGroup': minimum: got 0, want 1"),
    (["json:coordinator.migrationThreshold=1.5"], "at '/coordinator/migrationThreshold': maximum: got 1.5, want 1"),
    (["image.pullPolicy=Sometimes"], "at '/image/pullPolicy'"),
    (["redis.persistence.size=lots"], "at '/redis/persistence/size'"),
    (["sidecar.socketDir=relative/dir"], "at '/sidecar/socketDir'"),
    (["redis.external.url=http://x"], "at '/redis/external/url'"),
    (["redis.enabled=false"], "at '/redis/external': 'anyOf' failed"),
    (["pools.rollout.gpuCount=0"], "at '/pools/rollout/gpuCount': minimum: got 0, want 1"),
    (["tls.enabled=yes"], "at '/tls/enabled': got string, want boolean"),
    (["typo=1"], "additional properties 'typo' not allowed"),
]


@pytest.mark.parametrize(("sets", "message"), BAD, ids=[s[0][0] for s in BAD])
def test_bad_values_are_refused_with_a_message_naming_them(sets: list[str], message: str) -> None:
    args = ["template", "rm", str(CHART)]
    for s in sets:
        if s.startswith("json:"):
            args += ["--set-json", s[5:]]  # `--set` turns 1.5 into a string; --set-json and -f keep numbers
        else:
            args += ["--set-string" if s.endswith(("=abc", "=yes", "=lots")) else "--set", s]
    proc = helm(*args, check=False)
    assert proc.returncode != 0, f"{sets} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr, proc.stderr


def test_good_overrides_are_accepted() -> None:
    helm("template", "rm", str(CHART), "--set-json", "coordinator.leaseTtlSeconds=2.5", "--set",
         "catalog.gpus.B200.tflops=2250", "--set", "pools.train.enabled=false", "--set-string",
         "redis.persistence.size=50Gi")
