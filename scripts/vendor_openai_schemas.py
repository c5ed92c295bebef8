"""Cut the response schemas the server must satisfy out of OpenAI's published OpenAPI
document (github.com/openai/openai-openapi, openapi.json) into tests/server/data/openai_schemas.json.

Keeps the named schemas and everything they reference, as JSON Schema `$defs`
(`#/components/schemas/X` -> `#/$defs/X`), without descriptions and examples. The document
is OpenAPI 3.1 but a few schemas still say `"nullable": true` (OpenAPI 3.0), which JSON
Schema ignores; those are rewritten to what they mean (`null` allowed, also in an `enum`).
Usage: python scripts/vendor_openai_schemas.py openapi.json COMMIT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOTS = [
    "ListModelsResponse",
    "Model",
    "CreateCompletionResponse",
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "ErrorResponse",
]
DROP = {"description", "example", "examples", "x-oaiMeta", "x-oaiTypeLabel", "x-oaiExpandable", "title", "deprecated"}
OUT = Path(__file__).resolve().parents[1] / "tests" / "server" / "data" / "openai_schemas.json"


def strip(node, refs: set):
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in DROP and not isinstance(value, dict) or key == "x-oaiMeta":
                continue
            if key == "$ref":
                name = value.rsplit("/", 1)[1]
                refs.add(name)
                value = f"#/$defs/{name}"
            out[key] = strip(value, refs) if key != "properties" else {k: strip(v, refs) for k, v in value.items()}
        if out.pop("nullable", False):
            if "type" in out:
                out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
            if "enum" in out:
                out["enum"] = [*out["enum"], None]
            if "type" not in out and "enum" not in out:
                out = {"anyOf": [out, {"type": "null"}]}
        return out
    if isinstance(node, list):
        return [strip(v, refs) for v in node]
    return node


def main():
    spec = json.loads(Path(sys.argv[1]).read_text())
    schemas = spec["components"]["schemas"]
    defs, todo = {}, list(ROOTS)
    while todo:
        name = todo.pop()
        if name in defs:
            continue
        refs: set = set()
        defs[name] = strip(schemas[name], refs)
        todo += sorted(refs - defs.keys())
    doc = {
        "$comment": (
            f"Response schemas from OpenAI's OpenAPI document {spec['info']['version']} "
            f"(https://github.com/openai/openai-openapi, openapi.json at commit {sys.argv[2]}), "
            "cut by scripts/vendor_openai_schemas.py: descriptions and examples dropped, "
            "#/components/schemas/X rewritten to #/$defs/X, OpenAPI 3.0 "
            "'nullable: true' rewritten to JSON Schema (null allowed)."
        ),
        "$defs": dict(sorted(defs.items())),
    }
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(defs)} schemas -> {OUT}")


if __name__ == "__main__":
    main()
