"""Images through the official clients (issue 36).

Against `fastmlx serve` with SmolLM2, a model without vision: each dialect's image shape is read
and checked (OpenAI `image_url` data URLs, Responses `input_image`, Anthropic `image` blocks, in a
user turn and inside a Claude-Code-shaped `tool_result`, Ollama `images`), then refused with a 400
in the SDK's own exception that names the model; malformed and hostile images are refused with
their own reason; the server keeps serving.

Against a tiny random Qwen3-VL (tests/data/vision/tiny_qwen3_vl): the answer about an image is
mlx-vlm's greedy tokens (tests/data/reference/vision_qwen3_vl_generate.json), the same through
every dialect; the conversation's next turn reuses the image from the prefix cache; with
`--fetch-image-urls` an http URL is fetched (a URL that fails is a 400 naming it); a body cut
short and images past the context window are refused; the server keeps serving.

Against tiny random Gemma 3 and Gemma 4 models: their chat templates, Gemma 3's placeholder
expanded in the rendered text and Gemma 4's in the tokens, give the reference's prompt length and
tokens (transformers' attention: tests/data/reference/vision_gemma*_generate.json)."""

import base64
import json
import os
import struct
import zlib

import anthropic
import ollama
import openai
import pytest
from conftest import ROOT, launch


def png(width, height, rows=None):
    """A PNG of `width` x `height` grey pixels (stdlib only); `rows` overrides the pixel data."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = rows if rows is not None else b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


PNG = png(4, 3)
B64 = base64.b64encode(PNG).decode()
DATA_URL = f"data:image/png;base64,{B64}"


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server["url"], api_key="unused", max_retries=0)


def ask(oai, server, url, text="What is in this picture?"):
    return oai.chat.completions.create(model=server["model"], max_tokens=4, messages=[
        {"role": "user", "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]}])


def test_openai_image_url_is_read_then_refused_naming_the_model(oai, server):
    with pytest.raises(openai.BadRequestError) as e:
        ask(oai, server, DATA_URL)
    error = e.value.body
    assert error["param"] == "messages[0].content[1]"
    assert server["model"] in error["message"] and "reads text only" in error["message"]


def test_responses_input_image(oai, server):
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model=server["model"], max_output_tokens=4, input=[{"role": "user", "content": [
            {"type": "input_text", "text": "Describe it."}, {"type": "input_image", "image_url": DATA_URL}]}])
    assert server["model"] in e.value.body["message"]


def test_anthropic_image_blocks_and_a_screenshot_in_a_tool_result(server):
    client = anthropic.Anthropic(base_url=server["base"], api_key="any", max_retries=0)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}}
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="claude-x", max_tokens=4, messages=[
            {"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]}])
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert server["model"] in e.value.message
    # How Claude Code returns a screenshot: an image inside the tool's result.
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="claude-x", max_tokens=4, messages=[
            {"role": "user", "content": "Take a screenshot."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": [{"type": "text", "text": "Here it is."}, image]}]}],
            tools=[{"name": "screenshot", "description": "Take a screenshot", "input_schema": {"type": "object"}}])
    assert server["model"] in e.value.message


def test_ollama_images(server):
    client = ollama.Client(host=server["ollama"])
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=server["model"], messages=[{"role": "user", "content": "What is this?", "images": [PNG]}])
    assert e.value.status_code == 400 and server["model"] in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model=server["model"], prompt="What is this?", images=[B64])
    assert e.value.status_code == 400 and server["model"] in e.value.error


@pytest.mark.parametrize("url, reason", [
    ("https://example.com/cat.png", "not fetched"),
    (f"data:image/jpeg;base64,{B64}", "is image/png, not image/jpeg"),
    (f"data:image/bmp;base64,{B64}", "image/bmp is not taken"),
    (f"data:image/png;base64,{base64.b64encode(b'GIF89a but not really').decode()}", "is image/gif, not image/png"),
    (f"data:image/png;base64,{base64.b64encode(b'plain text').decode()}", "not PNG, JPEG"),
    # Cut inside its header (a body cut short is found when the pixels are decoded, for a model that sees).
    (f"data:image/png;base64,{base64.b64encode(PNG[:20]).decode()}", "cannot be decoded"),
    (f"data:image/png;base64,{base64.b64encode(png(100_000, 100_000, rows=b'')).decode()}", "100000 x 100000 pixels"),
    ("data:image/png;base64,not base64!", "base64 is invalid"),
])
def test_hostile_and_malformed_images_are_refused_with_their_reason(oai, server, url, reason):
    with pytest.raises(openai.BadRequestError) as e:
        ask(oai, server, url)
    assert reason in e.value.body["message"], e.value.body["message"]
    assert e.value.body["param"] == "messages[0].content[1]"


def test_fifty_images_are_refused_and_the_server_keeps_serving(oai, server):
    parts = [{"type": "image_url", "image_url": {"url": DATA_URL}} for _ in range(50)]
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=server["model"], max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "text", "text": "Compare them."}, *parts]}])
    assert "50 images in one request: at most 32" in e.value.body["message"]
    answer = oai.chat.completions.create(model=server["model"], max_tokens=4, temperature=0,
                                         messages=[{"role": "user", "content": "Say hi."}])
    assert answer.choices[0].message.content


# A model that sees.
VL_MODEL = ROOT / "tests/data/vision/tiny_qwen3_vl"
VL_REFERENCE = json.loads((ROOT / "tests/data/reference/vision_qwen3_vl_generate.json").read_text())
ONE_IMAGE = next(c for c in VL_REFERENCE["cases"] if c["name"] == "one image")
SMALL = (ROOT / "tests/data/vision/small.png").read_bytes()
SMALL_URL = "data:image/png;base64," + base64.b64encode(SMALL).decode()
QUESTION = "What is this?"


@pytest.fixture(scope="module")
def seeing(tmp_path_factory):
    # `--fetch-image-urls`: this server fetches http(s) image URLs (the SmolLM2 one refuses them),
    # here from a server on this machine, never through a proxy the environment names.
    os.environ["NO_PROXY"] = ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1", "localhost"]))
    yield from launch(tmp_path_factory, "client-tests-vision.log", ["--model", str(VL_MODEL), "--fetch-image-urls"])


@pytest.fixture(scope="module")
def vl(seeing):
    return openai.OpenAI(base_url=seeing["url"], api_key="unused", max_retries=0)


def ask_about_small(vl, seeing):
    return vl.chat.completions.create(
        model=seeing["model"], max_tokens=len(ONE_IMAGE["output_ids"]), temperature=0, logprobs=True,
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": SMALL_URL}},
                                               {"type": "text", "text": QUESTION}]}])


def test_an_image_gets_mlx_vlms_answer_and_the_next_turn_reuses_it(vl, seeing):
    answer = ask_about_small(vl, seeing)
    got = b"".join(bytes(t.bytes) for t in answer.choices[0].logprobs.content)
    assert list(got) == ONE_IMAGE["output_ids"]
    assert answer.usage.prompt_tokens == len(ONE_IMAGE["expanded_ids"])
    again = ask_about_small(vl, seeing)
    assert again.choices[0].message.content == answer.choices[0].message.content
    vision_end = ONE_IMAGE["expanded_ids"].index(260)
    assert again.usage.prompt_tokens_details.cached_tokens > vision_end


def test_every_dialect_reads_the_image_the_same(vl, seeing):
    n = len(ONE_IMAGE["output_ids"])
    want = ask_about_small(vl, seeing).choices[0].message.content
    b64 = base64.b64encode(SMALL).decode()
    client = anthropic.Anthropic(base_url=seeing["base"], api_key="any", max_retries=0)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
    message = client.messages.create(model="claude-x", max_tokens=n, extra_body={"temperature": 0}, messages=[
        {"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}])
    assert message.content[0].text == want
    ollama_client = ollama.Client(host=seeing["ollama"])
    chat = ollama_client.chat(model=seeing["model"], messages=[{"role": "user", "content": QUESTION, "images": [SMALL]}],
                              options={"temperature": 0, "num_predict": n})
    assert chat.message.content == want
    response = vl.responses.create(model=seeing["model"], max_output_tokens=n, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": SMALL_URL},
                                     {"type": "input_text", "text": QUESTION}]}])
    assert response.output_text == want
    # Claude Code's screenshot: an image inside a tool's result, answered.
    shot = client.messages.create(model="claude-x", max_tokens=n, messages=[
        {"role": "user", "content": "Take a screenshot."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "Here it is."}, image]}]}],
        tools=[{"name": "screenshot", "description": "Take a screenshot", "input_schema": {"type": "object"}}])
    assert shot.usage.input_tokens > 40 and shot.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_a_seeing_model_refuses_broken_and_oversized_images_and_keeps_serving(vl, seeing):
    cut = "data:image/png;base64," + base64.b64encode(SMALL[: len(SMALL) // 2]).decode()
    with pytest.raises(openai.BadRequestError) as e:
        vl.chat.completions.create(model=seeing["model"], max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": cut}}]}])
    assert e.value.body["param"] == "messages[0].content[0]" and "decoded" in e.value.body["message"]
    # 32 images of 1,000 x 1,000: 16,000 tokens for a 4,096-token context, refused before decoding.
    big = "data:image/png;base64," + base64.b64encode(png(1000, 1000)).decode()
    with pytest.raises(openai.BadRequestError) as e:
        vl.chat.completions.create(model=seeing["model"], max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": big}} for _ in range(32)]}])
    assert "the context window is 4096" in e.value.body["message"], e.value.body["message"]
    assert ask_about_small(vl, seeing).choices[0].message.content


def test_with_fetch_image_urls_an_http_image_is_fetched(vl, seeing):
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/small.png":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(SMALL)))
            self.end_headers()
            self.wfile.write(SMALL)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        def ask_url(url):
            return vl.chat.completions.create(
                model=seeing["model"], max_tokens=len(ONE_IMAGE["output_ids"]), temperature=0,
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                       {"type": "text", "text": QUESTION}]}])
        fetched = ask_url(base + "/small.png")
        assert fetched.choices[0].message.content == ask_about_small(vl, seeing).choices[0].message.content
        with pytest.raises(openai.BadRequestError) as e:
            ask_url(base + "/missing.png")
        assert e.value.body["param"] == "messages[0].content[0]"
        assert "could not be fetched: the server answered 404" in e.value.body["message"], e.value.body["message"]
    finally:
        httpd.shutdown()


def test_models_say_whether_they_see(vl, seeing, oai, server):
    import urllib.request

    listed = {m.id: m.model_extra.get("vision") for m in vl.models.list().data}
    assert listed[seeing["model"]] is True
    assert {m.id: m.model_extra.get("vision") for m in oai.models.list().data}[server["model"]] is False
    # Ollama's clients (Open WebUI among them) offer images where /api/show lists "vision".
    show = lambda base, model: json.loads(urllib.request.urlopen(urllib.request.Request(
        base + "/api/show", data=json.dumps({"model": model}).encode(), headers={"Content-Type": "application/json"})).read())
    assert "vision" in show(seeing["ollama"], seeing["model"])["capabilities"]
    assert "vision" not in show(server["ollama"], server["model"])["capabilities"]


# Gemma 3 (its placeholder expanded in the rendered text) and Gemma 4 (in the tokens), through
# their chat templates: the reference's tokens for one image and for two (transformers' attention:
# each image's tokens see each other; tests/data/reference/vision_gemma*_generate.json).
def data_url(name):
    kind = {"png": "png", "gif": "gif", "jpg": "jpeg"}[name.rsplit(".", 1)[1]]
    return f"data:image/{kind};base64," + base64.b64encode((ROOT / "tests/data/vision" / name).read_bytes()).decode()


@pytest.fixture(scope="module", params=["gemma3", "gemma4"])
def gemma(request, tmp_path_factory):
    family = request.param
    reference = json.loads((ROOT / f"tests/data/reference/vision_{family}_generate.json").read_text())
    for served in launch(tmp_path_factory, f"client-tests-{family}.log",
                         ["--model", str(ROOT / f"tests/data/vision/tiny_{family}")]):
        yield served, reference


def test_gemma_reads_images_through_its_template(gemma):
    served, reference = gemma
    client = openai.OpenAI(base_url=served["url"], api_key="unused", max_retries=0)
    for case in (c for c in reference["cases"] if c["name"] in ("one image", "two images")):
        messages = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else [
            {"type": "image_url", "image_url": {"url": data_url(p["image_url"]["url"])}} if p["type"] == "image_url"
            else p for p in m["content"]]} for m in case["messages"]]
        answer = client.chat.completions.create(model=served["model"], max_tokens=len(case["output_ids"]),
                                                temperature=0, logprobs=True, messages=messages)
        got = b"".join(bytes(t.bytes) for t in answer.choices[0].logprobs.content)
        assert answer.usage.prompt_tokens == len(case["expanded_ids"]), case["name"]
        # The reference's tokens up to the first that is not a byte (a special or unused id).
        want = []
        for t in case["output_ids"]:
            if t >= 256:
                break
            want.append(t)
        assert len(want) >= 3 and list(got[:len(want)]) == want, case["name"]
