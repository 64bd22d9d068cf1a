"""Structured outputs and tool calls through the `openai` package: JSON Schema answers (the SDK's own
`parse` helper with pydantic models, and hand-written schemas checked with `jsonschema`), forced
tool calls, streamed tool-call arguments, and a whole tool round trip. SmolLM2's template has no
tool support, so every call here comes from constrained decoding."""

import json
from datetime import datetime
from typing import Literal, Optional

import jsonschema
import openai
import pytest
from pydantic import BaseModel, EmailStr, Field, conint, constr


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server["url"], api_key="any", max_retries=0)


def user(content):
    return [{"role": "user", "content": content}]


class City(BaseModel):
    name: str
    country: str
    population: int = Field(ge=0)
    landmarks: list[str] = Field(max_length=3)


def test_parse_helper_with_a_pydantic_model(client, server):
    r = client.chat.completions.parse(model=server["model"], messages=user("Describe Paris as JSON."),
                                      response_format=City, temperature=0, max_tokens=120)
    assert r.choices[0].finish_reason == "stop"
    city = r.choices[0].message.parsed
    assert isinstance(city, City) and city.population >= 0 and len(city.landmarks) <= 3


class Passenger(BaseModel):
    name: str = Field(max_length=20)
    age: conint(ge=0, le=120)


class Address(BaseModel):
    street: str = Field(max_length=30)
    postcode: constr(pattern=r"^[0-9]{5}$")


class Booking(BaseModel):
    code: constr(pattern=r"^[A-Z]{3}-[0-9]{4}$")
    contact: EmailStr = Field(max_length=40)
    departs: datetime
    seats: conint(ge=2, le=12, multiple_of=2)
    kind: Literal["flight", "train"]
    address: Optional[Address]
    passengers: list[Passenger] = Field(max_length=2)


@pytest.mark.parametrize("temperature", [0, 0.8])
def test_parse_helper_with_patterns_formats_and_multiples(client, server, temperature):
    """What OpenAI, llama.cpp and vLLM accept: `pattern`, `format` (email, date-time),
    `multipleOf`, `Literal`, nested optional models, lists of models; pydantic checks the answer."""
    r = client.chat.completions.parse(model=server["model"], messages=user("Book two seats to Rome as JSON."),
                                      response_format=Booking, temperature=temperature, seed=7, max_tokens=300)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    booking = r.choices[0].message.parsed
    assert isinstance(booking, Booking) and booking.seats % 2 == 0 and len(booking.passengers) <= 2


SCHEMA = {
    "type": "object",
    "properties": {
        "mood": {"enum": ["happy", "sad", "neutral"]},
        "score": {"type": "integer", "minimum": 1, "maximum": 10},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
        "note": {"type": ["string", "null"]},
    },
    "required": ["mood", "score", "tags"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_sampled_json_schema_answers_validate(client, server, seed):
    r = client.chat.completions.create(
        model=server["model"], messages=user("How was your day? Answer in JSON."), temperature=1.0, seed=seed, max_tokens=120,
        response_format={"type": "json_schema", "json_schema": {"name": "day", "schema": SCHEMA, "strict": True}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_json_object_streamed(client, server):
    chunks = client.chat.completions.create(model=server["model"], messages=user("Give a JSON object with keys name and age for Bob, 30."), temperature=0,
                                            max_tokens=80, response_format={"type": "json_object"}, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(json.loads(text), dict)


def test_unsupported_schema_is_the_sdks_bad_request(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server["model"], messages=user("x"), response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "propertyNames": {"pattern": "^a"}}}})
    assert e.value.body["param"] == "response_format" and "propertyNames" in e.value.body["message"]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_tool_round_trip(client, server):
    messages = user("What is the weather in Paris?")
    r = client.chat.completions.create(model=server["model"], messages=messages, tools=[WEATHER, TIME],
                                       tool_choice="required", temperature=0, max_tokens=80)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name in ("get_weather", "get_time")
    args = json.loads(call.function.arguments)
    assert isinstance(args["city"], str)
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "sunny"})}]
    final = client.chat.completions.create(model=server["model"], messages=messages, tools=[WEATHER, TIME],
                                           temperature=0, max_tokens=40)
    assert final.choices[0].message.content and final.choices[0].message.tool_calls is None


def test_named_function_streams_its_arguments(client, server):
    chunks = list(client.chat.completions.create(
        model=server["model"], messages=user("Weather in Oslo, in celsius?"), tools=[WEATHER, TIME], temperature=0,
        max_tokens=80, stream=True, tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather" and deltas[0].id.startswith("call_")
    assert len(deltas) > 3, "the arguments stream in pieces"
    args = json.loads("".join(d.function.arguments or "" for d in deltas))
    jsonschema.validate(args, WEATHER["function"]["parameters"])


class GetWeather(BaseModel):
    city: str
    unit: Literal["celsius", "fahrenheit"]


def test_pydantic_function_tool_with_parse(client, server):
    r = client.chat.completions.parse(model=server["model"], messages=user("Is it cold in Helsinki?"),
                                      tools=[openai.pydantic_function_tool(GetWeather)], tool_choice="required",
                                      temperature=0, max_tokens=80)
    parsed = r.choices[0].message.tool_calls[0].function.parsed_arguments
    assert isinstance(parsed, GetWeather)


def test_tool_choice_errors(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server["model"], messages=user("x"), tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice"
