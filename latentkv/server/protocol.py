"""OpenAI request bodies as pydantic models, and their translation to `SamplingParams`.

Types are strict (a string where a number belongs is a 400, as with OpenAI), except that
an integral float such as 7.0 counts as an integer (JSON Schema's rule); floats must be
finite. Every number has bounds, so nothing out of range reaches a tensor op; token ids
are checked against the vocabulary when the prompt is prepared. Fields we do not know are
ignored, as OpenAI does. vLLM's extras `top_k`, `min_p`, `min_tokens`, `ignore_eos`,
`repetition_penalty`, `stop_token_ids`, `guided_json`, `guided_regex`, `guided_choice` are
accepted too.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from latentkv.guided import GuidedDecodingError, GuidedDecodingParams
from latentkv.sampling_params import SamplingParams

MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_INT = 2**31 - 1  # counts and token ids: anything larger is a client error, not a tensor overflow
MAX_STOP = 16  # stop strings / stop token ids per request
MAX_PROMPTS = 64  # prompts in one completions request
MAX_CHOICES = 256  # guided_choice strings
MAX_TOOLS = 128


def integral(value):
    """7.0 -> 7 (JSON Schema counts it as an integer); anything else is left to the strict check."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def Int(**bounds):
    """An integer field with bounds (ge/le/...); the bounds sit beside the int so the JSON
    Schema gets minimum/maximum, and the before-validator turns 7.0 into 7."""
    return Annotated[int, Field(**bounds), BeforeValidator(integral)]


TokenId = Int(ge=0, le=MAX_INT)
TokenIds = list[TokenId]
STRICT = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


def sampling_param_named(err: ValueError) -> str | None:
    """The field a `SamplingParams` check names first (its messages start with it)."""
    first = str(err).split(" ", 1)[0]
    return first if first in SamplingParams.__dataclass_fields__ else None


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)
    name: str | None = None  # required by OpenAI; only a label here
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None  # the schema is always enforced, strict or not


class ResponseFormat(BaseModel):
    model_config = STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(BaseModel):
    """The fields completions and chat share."""

    model_config = STRICT

    model: str | None = None
    n: Int(ge=1, le=MAX_N) = 1
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Int(ge=-1, le=MAX_INT) | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=1e4)] | None = None
    seed: Int(ge=-(2**63), lt=2**63 - MAX_N) | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    min_tokens: Int(ge=0, le=MAX_INT) = 0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    response_format: ResponseFormat | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: Annotated[list[str], Field(min_length=1, max_length=MAX_CHOICES)] | None = None

    def guided(self) -> GuidedDecodingParams | None:
        """What the output must match, from response_format or vLLM's guided_* fields (one of them);
        raises GuidedDecodingError naming the field."""
        given = []
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            given.append(GuidedDecodingParams(json_object=True, param="response_format"))
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.json_schema is None or fmt.json_schema.schema_ is None:
                raise GuidedDecodingError(
                    "response_format of type json_schema needs json_schema.schema", "response_format.json_schema.schema"
                )
            given.append(GuidedDecodingParams(json=fmt.json_schema.schema_, param="response_format.json_schema.schema"))
        if self.guided_json is not None:
            given.append(GuidedDecodingParams(json=self.guided_json, param="guided_json"))
        if self.guided_regex is not None:
            given.append(GuidedDecodingParams(regex=self.guided_regex, param="guided_regex"))
        if self.guided_choice is not None:
            given.append(GuidedDecodingParams(choice=tuple(self.guided_choice), param="guided_choice"))
        if len(given) > 1:
            raise GuidedDecodingError(
                f"give at most one of response_format, guided_json, guided_regex, guided_choice; "
                f"got {', '.join(g.param for g in given)}",
                given[1].param,
            )
        return given[0] if given else None

    def sampling_params(
        self,
        max_tokens: int | None,
        logprobs: int | None,
        guided: GuidedDecodingParams | None = None,
        prompt_logprobs: int | None = None,
    ) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            n=self.n,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=self.repetition_penalty or 1.0,
            seed=self.seed,
            stop=stop,
            stop_token_ids=self.stop_token_ids,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            guided_decoding=guided,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: Union[str, TokenIds, Annotated[list[Union[str, TokenIds]], Field(max_length=MAX_PROMPTS)]]
    max_tokens: Int(ge=0, le=MAX_INT) | None = 16  # 0: score the prompt only (with echo and logprobs)
    logprobs: Int(ge=0, le=MAX_TOP_LOGPROBS) | None = None
    echo: bool = False
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of prompts (each a string or a list of token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [p]
        return list(p)


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


class FunctionDef(BaseModel):
    model_config = STRICT
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]
    description: str | None = None
    parameters: dict | None = None  # a JSON schema; none means no arguments
    strict: bool | None = None  # the schema is always enforced


class Tool(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: FunctionDef


class FunctionName(BaseModel):
    model_config = STRICT
    name: str


class NamedToolChoice(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: FunctionName


class CalledFunction(BaseModel):
    model_config = STRICT
    name: str
    arguments: str


class ToolCall(BaseModel):
    """An earlier assistant turn's tool call, sent back by the client."""

    model_config = STRICT
    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOLS)] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Int(ge=1, le=MAX_INT) | None = None
    max_completion_tokens: Int(ge=1, le=MAX_INT) | None = None
    logprobs: bool = False
    top_logprobs: Int(ge=0, le=MAX_TOP_LOGPROBS) | None = None
    add_generation_prompt: bool = True
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def conversation(self) -> list[dict]:
        """Messages as the chat template expects them ("developer" counts as "system"); earlier
        tool calls and tool results keep the fields templates that know tools read."""
        messages = []
        for m in self.messages:
            message = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            if m.tool_calls:
                message["tool_calls"] = [call.model_dump() for call in m.tool_calls]
            if m.tool_call_id is not None:
                message["tool_call_id"] = m.tool_call_id
            messages.append(message)
        return messages

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
