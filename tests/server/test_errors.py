"""Every error case answers OpenAI's error JSON with the right status."""

from __future__ import annotations

import httpx
import openai
import pytest

from server_helpers import MODEL_NAME, start_server

CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2}


def post(server, path: str, body=None, content: bytes | None = None, headers: dict | None = None) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, content=content, headers=headers, timeout=60)


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) >= {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


def test_malformed_json_is_400(server):
    err = error_of(
        post(
            server,
            "/chat/completions",
            content=b'{"model": "tiny-mla", "messages": [',
            headers={"content-type": "application/json"},
        ),
        400,
    )
    assert "JSON" in err["message"] and err["type"] == "invalid_request_error"
    err = error_of(post(server, "/completions", content=b"[1, 2]", headers={"content-type": "application/json"}), 400)


@pytest.mark.parametrize(
    "field,value",
    [("temperature", "hot"), ("max_tokens", "5"), ("n", 1.5), ("stop", 3), ("stream", "yes"), ("seed", "1")],
)
def test_wrong_types_are_400_naming_the_field(server, field, value):
    err = error_of(post(server, "/completions", {**COMPLETION, field: value}), 400)
    assert err["param"] == field and field in err["message"]


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", 2.5),
        ("temperature", -0.1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("n", 0),
        ("n", 100),
        ("max_tokens", -1),
        ("presence_penalty", 3.0),
        ("frequency_penalty", -2.5),
        ("top_k", -2),
        ("min_p", 1.5),
        ("logprobs", 50),
        ("seed", 2**70),
    ],
)
def test_out_of_range_values_are_400(server, field, value):
    err = error_of(post(server, "/completions", {**COMPLETION, field: value}), 400)
    assert err["param"] == field


def test_chat_ranges_and_missing_fields_are_400(server):
    assert (
        error_of(post(server, "/chat/completions", {**CHAT, "top_logprobs": 21, "logprobs": True}), 400)["param"]
        == "top_logprobs"
    )
    assert (
        error_of(post(server, "/chat/completions", {**CHAT, "max_completion_tokens": 0}), 400)["param"]
        == "max_completion_tokens"
    )
    assert error_of(post(server, "/chat/completions", {"model": MODEL_NAME}), 400)["param"] == "messages"
    assert (
        "role"
        in error_of(post(server, "/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "x"}]}), 400)[
            "message"
        ]
    )


def test_empty_prompts_are_400(server):
    assert "empty" in error_of(post(server, "/completions", {**COMPLETION, "prompt": ""}), 400)["message"]
    assert "empty" in error_of(post(server, "/completions", {**COMPLETION, "prompt": []}), 400)["message"]
    assert error_of(post(server, "/chat/completions", {**CHAT, "messages": []}), 400)["param"] == "messages"
    assert (
        "empty"
        in error_of(post(server, "/chat/completions", {**CHAT, "messages": [{"role": "user", "content": ""}]}), 400)[
            "message"
        ]
    )


def test_prompt_longer_than_max_model_len_is_400(server, client):
    err = error_of(post(server, "/completions", {**COMPLETION, "prompt": [5] * 300}), 400)
    assert "max_model_len" in err["message"] and err["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "the dog " * 200}])
    assert "max_model_len" in str(info.value)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_NAME, prompt=[7, 500000], max_tokens=2)  # id outside the vocabulary


def test_unknown_model_is_404(server, client):
    err = error_of(post(server, "/completions", {**COMPLETION, "model": "gpt-5"}), 404)
    assert err["code"] == "model_not_found" and "gpt-5" in err["message"] and err["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert error_of(httpx.get(server.url + "/v1/nowhere"), 404)


def test_unknown_fields_are_ignored(server):
    response = post(server, "/completions", {**COMPLETION, "best_of_everything": True, "user": "me", "tools": []})
    assert response.status_code == 200 and response.json()["choices"][0]["text"] is not None


@pytest.fixture(scope="module")
def tight_server(tiny_model_dir):
    """One running slot, no waiting room, an API key."""
    running = start_server(
        tiny_model_dir,
        api_key="sekret",
        max_waiting_requests=0,
        max_num_seqs=1,
        max_model_len=256,
        kv_cache_memory="4MiB",
    )
    yield running
    running.stop()


def test_api_key_is_required_when_set(tight_server):
    assert error_of(post(tight_server, "/completions", COMPLETION), 401)["type"] == "authentication_error"
    assert error_of(post(tight_server, "/completions", COMPLETION, headers={"Authorization": "Bearer wrong"}), 401)
    assert error_of(httpx.get(tight_server.base_url + "/models", headers={"Authorization": "sekret"}), 401)
    ok = post(tight_server, "/completions", COMPLETION, headers={"Authorization": "Bearer sekret"})
    assert ok.status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=tight_server.base_url, api_key="bad", max_retries=0).models.list()
    assert httpx.get(tight_server.url + "/health").status_code == 200  # health needs no key


def test_full_waiting_queue_is_503_with_retry_after(tight_server):
    client = openai.OpenAI(base_url=tight_server.base_url, api_key="sekret", max_retries=0, timeout=120)
    long_run = client.completions.create(
        model=MODEL_NAME,
        prompt="the quick",
        max_tokens=240,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    try:
        next(iter(long_run))  # it runs now, holding the only slot
        response = post(tight_server, "/completions", COMPLETION, headers={"Authorization": "Bearer sekret"})
        err = error_of(response, 503)
        assert response.headers["retry-after"] == "1" and "busy" in err["message"]
    finally:
        long_run.close()
