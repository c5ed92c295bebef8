"""OpenAI's published response schemas (data/openai_schemas.json, vendored from
openai/openai-openapi) and small HTTP helpers for the conformance tests."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

DEFS = json.loads((Path(__file__).parent / "data" / "openai_schemas.json").read_text())["$defs"]


def check(body: dict, name: str) -> None:
    """Raise jsonschema's ValidationError unless `body` matches the spec's schema `name`."""
    import jsonschema

    jsonschema.Draft202012Validator({"$ref": f"#/$defs/{name}", "$defs": DEFS}).validate(body)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=120)


def events(server, path: str, body: dict) -> list[dict]:
    """The JSON events of a streamed answer (after checking it ends with [DONE])."""
    with httpx.stream("POST", server.base_url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        data = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]
