"""The published JSON Schema of a payload definition, generated from the model.

``payloads/schema/definition-v<N>.json`` is committed; a test checks it equals
``generate()``. Regenerate with ``python -m upwell.payloads.schema``.
"""

from __future__ import annotations

import json
import sys

from upwell import REPO
from upwell.payloads.definition import SCHEMA_VERSION, Definition

PATH = REPO / "payloads" / "schema" / f"definition-v{SCHEMA_VERSION}.json"


def generate() -> dict:
    schema = Definition.model_json_schema(by_alias=True, mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://upwell.dev/schemas/payload-definition-v{SCHEMA_VERSION}.json",
            "x-schema-version": SCHEMA_VERSION, **schema}


def text() -> str:
    return json.dumps(generate(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    PATH.parent.mkdir(parents=True, exist_ok=True)
    PATH.write_text(text())
    sys.stdout.write(f"wrote {PATH.relative_to(REPO)}\n")
