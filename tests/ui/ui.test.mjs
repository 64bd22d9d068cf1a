// The web UI (ui/, built into ui/dist by scripts/setup.sh) in headless Chromium against a real
// `fastmlx serve`: the Models, Chat, Live, Server and Discover pages as a person uses them.
// Screenshots of each page land in target/ui-screenshots/. Run by scripts/test.sh:
//   node --test tests/ui/
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { bf16ParamsFor, startFakeHub } from "./fake-hub.mjs";
import { api, launchBrowser, makeTinyModel, openPage, root, screenshot, startServer, until } from "./harness.mjs";

const SMOL = "SmolLM2-135M-Instruct.Q4_1";
const TINY_REPO = "test-org/tiny-qwen2-mlx";
const OTHER_REPO = "test-org/tiny-qwen3-mlx";
const TIGHT_REPO = "mlx-community/Tight-Fit-bf16-mlx";
const HUGE_REPO = "mlx-community/Huge-405B-bf16-mlx";
// Discover's recommendations (FASTMLX_RECOMMENDED): a tiny model on the fake Hub, listed after
// one too big for any machine, so the one that fits must be sorted first.
const REC_REPO = "test-org/tiny-recommended";
const REC_TOO_BIG = "test-org/colossal-recommended";
const REC_MID = "test-org/mid-8b-recommended";
const REC_LARGE = "test-org/large-70b-recommended";

let server;
let browser;
let hub;
let hubFiles;

before(async () => {
  hubFiles = mkdtempSync(path.join(tmpdir(), "fastmlx-ui-hub-"));
  const recDir = makeTinyModel(path.join(hubFiles, "rec"), "qwen3");
  const recList = path.join(hubFiles, "recommended.json");
  writeFileSync(recList, JSON.stringify(recommendedList(JSON.parse(readFileSync(path.join(recDir, "config.json"), "utf8")))));
  hub = await startFakeHub([
    { id: REC_REPO, dir: recDir, downloads: 1, likes: 0 },
    { id: TINY_REPO, dir: makeTinyModel(path.join(hubFiles, "a"), "qwen2"), downloads: 1234, likes: 5, params: { F32: 362_000 } },
    { id: OTHER_REPO, dir: makeTinyModel(path.join(hubFiles, "b"), "qwen3"), downloads: 10, likes: 1, params: { F32: 362_000 } },
    { id: TIGHT_REPO, downloads: 50_000, likes: 300, params: bf16ParamsFor(0.63) },
    { id: HUGE_REPO, downloads: 9_000, likes: 80, params: { BF16: 405_000_000_000 } },
  ]);
  // Drafting forced (speculative decoding, same output): the Live page's acceptance is then shown.
  server = await startServer({
    tinyModels: ["tiny-llama", "tiny-doomed"],
    env: { HF_ENDPOINT: hub.url, HF_TOKEN: "", FASTMLX_SPECULATIVE: "ngram", FASTMLX_RECOMMENDED: recList },
  });
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await server?.stop();
  await hub?.close();
  if (hubFiles) rmSync(hubFiles, { recursive: true, force: true });
});

/** A recommendations file, one use: the tiny model (config `tiny`), Llama-shaped 8B at 16 bits
 * (16 GB of weights), 70B at 4.5 bits (40 GB) and a 1.6T-parameter one that fits nowhere. */
function recommendedList(tiny) {
  const llama = (hidden, intermediate, layers, heads) => ({ model_type: "llama", hidden_size: hidden,
    intermediate_size: intermediate, num_hidden_layers: layers, num_attention_heads: heads, num_key_value_heads: 8,
    vocab_size: 128256, max_position_embeddings: 131072, rms_norm_eps: 1e-5, rope_theta: 500000,
    tie_word_embeddings: false });
  const colossal = llama(32768, 131072, 128, 128);
  return {
    version: 1,
    updated: "2026-12-05",
    uses: [{ id: "coding", title: "Coding agents", blurb: "For the tests." }],
    models: [
      { name: "Colossal", uses: ["coding"], kind: "chat", parameters_b: 1650, summary: "Too big anywhere.", config: colossal,
        quantizations: [{ repo: REC_TOO_BIG, label: "BF16", bits_per_weight: 16 }] },
      { name: "Large", uses: ["coding"], kind: "chat", parameters_b: 70.6, summary: "A 70B.", config: llama(8192, 28672, 80, 64),
        quantizations: [{ repo: REC_LARGE, label: "4-bit", bits_per_weight: 4.5 }] },
      { name: "Mid", uses: ["coding"], kind: "chat", parameters_b: 8.0, summary: "An 8B.", config: llama(4096, 14336, 32, 32),
        quantizations: [{ repo: REC_MID, label: "BF16", bits_per_weight: 16 }] },
      { name: "Tiny", uses: ["coding"], kind: "chat", parameters_b: 0.0004, summary: "Fits anywhere.", config: tiny,
        quantizations: [{ repo: REC_REPO, label: "F32", bits_per_weight: 32 }] },
    ],
  };
}

async function open(route, options) {
  const { context, page } = await openPage(browser, options);
  await page.goto(`${server.base}/ui/#/${route}`);
  await page.getByTestId(`page-${route}`).waitFor();
  return { context, page };
}

function assertClean(page) {
  assert.deepEqual(page.problems, [], "no errors in the page");
}

const text = (locator) => locator.textContent().then((t) => t ?? "");

describe("web UI", { concurrency: false }, () => {
  test("the UI is served at /ui/ with relative assets", async () => {
    const res = await fetch(`${server.base}/ui/`);
    assert.equal(res.status, 200);
    const html = await res.text();
    assert.match(html, /src="\.\/assets\/[^"]+\.js"/);
    const asset = html.match(/src="\.\/(assets\/[^"]+\.js)"/)[1];
    const js = await fetch(`${server.base}/ui/${asset}`);
    assert.equal(js.status, 200);
  });

  test("models: list, load, unload, delete with force", async () => {
    const { context, page } = await open("models");
    try {
      page.on("dialog", (d) => d.accept());
      const row = page.locator('[data-testid=model-row][data-model="tiny-llama"]');
      await row.waitFor();
      assert.equal(await row.getAttribute("data-loaded"), "false");
      const cells = await row.locator("td").allTextContents();
      assert.match(cells.join(" | "), /llama/, "architecture shown");
      assert.match(cells[1], /\d+(\.\d+)? (KB|MB)/, "size in human bytes");
      assert.match(cells[5], /^4 × [\d.]+k? ctx\s*fits$/, "the context four requests get here, and the fit");
      assert.match(cells[6], /FastMLX/, "source");
      // The default model, loaded at start from outside the model folders, is listed as loaded.
      const smol = page.locator(`[data-testid=model-row][data-model="${SMOL}"]`);
      await smol.waitFor();
      assert.equal(await smol.getAttribute("data-loaded"), "true");
      await smol.getByTestId("loaded-badge").waitFor();

      await row.getByTestId("load").click();
      await page.locator('[data-testid=model-row][data-model="tiny-llama"][data-loaded="true"]').waitFor({ timeout: 60_000 });
      await row.getByTestId("loaded-badge").waitFor();
      const status = await api(server, "/admin/status");
      assert.ok(status.loaded.some((m) => m.id === "tiny-llama"), "the server has it loaded");
      await screenshot(page, "models");

      await row.getByTestId("unload").click();
      await page.locator('[data-testid=model-row][data-model="tiny-llama"][data-loaded="false"]').waitFor({ timeout: 30_000 });
      assert.ok(!(await api(server, "/admin/status")).loaded.some((m) => m.id === "tiny-llama"));

      // FastMLX did not download it: refused (403), then "delete anyway" forces it.
      const doomed = page.locator('[data-testid=model-row][data-model="tiny-doomed"]');
      await doomed.getByTestId("delete").click();
      await page.getByTestId("error").waitFor();
      await page.getByTestId("delete-anyway").click();
      await doomed.waitFor({ state: "detached", timeout: 30_000 });
      assert.ok(!(await api(server, "/admin/models")).some((m) => m.id === "tiny-doomed"));
      assertClean(page);
    } finally {
      await context.close();
    }
  });

  test("chat: streamed reply, stats, stop, survives a reload", async () => {
    const { context, page } = await open("chat");
    try {
      const select = page.getByTestId("chat-model");
      await until(async () => (await select.locator("option").allTextContents()).some((t) => t.includes(SMOL)), "the model list");
      const options = await select.locator("option").allTextContents();
      assert.match(options[0], /\(loaded\)/, "loaded models first");
      await select.selectOption(SMOL);
      await page.getByTestId("chat-temperature").fill("0");
      await page.getByTestId("chat-max-tokens").fill("48");

      // Shift+Enter adds a line and sends nothing.
      const input = page.getByTestId("chat-input");
      await input.click();
      await page.keyboard.type("line one");
      await page.keyboard.press("Shift+Enter");
      await page.keyboard.type("line two");
      assert.equal(await input.inputValue(), "line one\nline two");
      assert.equal(await page.getByTestId("message").count(), 0);
      await input.fill("What is the capital of France?");
      await input.press("Enter");

      // The reply grows while it streams, then ends with its token count and speed.
      const reply = page.locator('[data-testid=message][data-role=assistant]').last();
      await reply.waitFor();
      const lengths = [];
      await until(
        async () => {
          lengths.push((await text(reply.getByTestId("message-content"))).length);
          return (await reply.getAttribute("data-streaming")) === "false";
        },
        "the reply to end",
        { timeout: 120_000, interval: 50 },
      );
      const grown = lengths.filter((n, i) => i > 0 && n > lengths[i - 1]).length;
      assert.ok(grown >= 2, `the reply grew while streaming (lengths seen: ${lengths.join(",")})`);
      assert.match(await text(reply.getByTestId("message-content")), /Paris/);
      const stats = reply.getByTestId("reply-stats");
      assert.ok(Number(await stats.getAttribute("data-tokens")) > 0);
      assert.match(await text(stats), /\d+ tokens · [\d.]+ tok\/s/);
      await screenshot(page, "chat");

      // Stop a long reply: the stream ends at once, the text stops growing, the server frees the row.
      await page.getByTestId("chat-max-tokens").fill("");
      await input.fill("Write a very long story about a dragon who learns to bake bread. Make it at least 2000 words.");
      await page.getByTestId("chat-send").click();
      const long = page.locator('[data-testid=message][data-role=assistant]').last();
      await until(async () => (await text(long.getByTestId("message-content"))).length > 40, "the story to start", { timeout: 120_000 });
      await page.getByTestId("chat-stop").click();
      await until(async () => (await long.getAttribute("data-streaming")) === "false", "the stop");
      assert.match(await text(long.getByTestId("reply-stats")), /stopped/);
      const stopped = await text(long.getByTestId("message-content"));
      await page.waitForTimeout(1000);
      assert.equal(await text(long.getByTestId("message-content")), stopped, "no more text after Stop");
      await until(async () => (await api(server, "/admin/status")).loaded.every((m) => m.running === 0), "the server to cancel the request", { timeout: 15_000 });
      await page.getByTestId("chat-send").waitFor();

      // Kept across a reload: the conversation, its messages and the model.
      await page.waitForTimeout(300);
      await page.reload();
      await page.getByTestId("page-chat").waitFor();
      const items = page.getByTestId("conversation-item");
      await until(async () => (await items.count()) === 1, "one conversation listed");
      assert.match(await text(items.first()), /What is the capital of France/);
      const messages = page.getByTestId("message");
      assert.equal(await messages.count(), 4);
      assert.match(await text(messages.nth(1)), /Paris/);
      assert.equal(await text(messages.nth(3).getByTestId("message-content")), stopped);
      await until(async () => (await select.inputValue()) === SMOL, "the conversation's model");

      // A new conversation starts empty; the old one is still there to go back to.
      await page.getByTestId("chat-new").click();
      assert.equal(await page.getByTestId("message").count(), 0);
      await page.locator("[data-testid=conversation-item]", { hasText: "capital of France" }).click();
      assert.equal(await page.getByTestId("message").count(), 4);
      assertClean(page);
    } finally {
      await context.close();
    }
  });

  test("chat: edit a sent message, regenerate, per-conversation settings, search, export", async () => {
    const { context, page } = await open("chat");
    try {
      await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: server.base });
      await page.getByTestId("chat-new").click();
      const select = page.getByTestId("chat-model");
      await until(async () => (await select.locator("option").allTextContents()).some((t) => t.includes(SMOL)), "the model list");
      await select.selectOption(SMOL);
      await page.getByTestId("chat-temperature").fill("0");
      await page.getByTestId("chat-max-tokens").fill("6");
      const done = async () =>
        until(async () => (await page.locator("[data-testid=message][data-streaming=true]").count()) === 0 && (await page.getByTestId("regenerate").count()) === 1, "the reply to end", { timeout: 60_000 });
      await page.getByTestId("chat-input").fill("Say hello.");
      await page.getByTestId("chat-input").press("Enter");
      await done();
      const messages = page.getByTestId("message");
      const first = await text(messages.nth(1).getByTestId("message-content"));

      // Regenerate: the same history answered again (greedy: the same answer), still one reply.
      await page.getByTestId("regenerate").click();
      await done();
      assert.equal(await messages.count(), 2);
      assert.equal(await text(messages.nth(1).getByTestId("message-content")), first);

      // Edit the question: the conversation goes on from it.
      await messages.nth(0).getByTestId("edit").click();
      await page.getByTestId("edit-input").fill("Say goodbye.");
      await page.getByTestId("edit-send").click();
      await done();
      assert.equal(await messages.count(), 2);
      assert.equal(await text(messages.nth(0).getByTestId("message-content")), "Say goodbye.");

      // The settings belong to this conversation: a new one starts from the defaults.
      await page.getByTestId("chat-new").click();
      assert.equal(await page.getByTestId("chat-max-tokens").inputValue(), "");
      await page.locator("[data-testid=conversation-item]", { hasText: "Say hello" }).click();
      assert.equal(await page.getByTestId("chat-max-tokens").inputValue(), "6");

      // Search by title or content.
      const items = page.getByTestId("conversation-item");
      await page.getByTestId("chat-search").fill("GOODBYE");
      await until(async () => (await items.count()) === 1, "one conversation says goodbye");
      await page.getByTestId("chat-search").fill("no conversation says this");
      await until(async () => (await items.count()) === 0, "none listed");
      await page.getByTestId("chat-search").fill("");

      // Export as Markdown.
      await page.getByTestId("chat-export").click();
      const markdown = await page.evaluate(() => navigator.clipboard.readText());
      assert.match(markdown, /^# Say hello\./);
      assert.match(markdown, /## You\n\nSay goodbye\./);
      assert.ok(markdown.includes(`## Assistant (${SMOL})`), markdown);
      assertClean(page);
    } finally {
      await context.close();
    }
  });

  test("chat: markdown sanitized, code blocks with copy buttons, reasoning folded", async () => {
    const { context, page } = await openPage(browser);
    try {
      await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: server.base });
      await context.addInitScript((model) => {
        if (localStorage.getItem("fastmlx.chats")) return;
        const reply = [
          "Here is **bold** and a [link](https://example.com).",
          "",
          "<img src=x onerror=\"window.__xss = 1\"><script>window.__xss = 2</script>",
          "",
          "```python",
          "print('hi')",
          "```",
        ].join("\n");
        localStorage.setItem(
          "fastmlx.chats",
          JSON.stringify([
            {
              id: "seeded",
              title: "Seeded",
              model,
              system: "Be brief.",
              updated: Date.now(),
              messages: [
                { role: "user", content: "Show me code" },
                { role: "assistant", content: reply, reasoning: "The user wants code.", model, stats: { completion_tokens: 12, tokens_per_sec: 30, ttft_ms: 100 } },
              ],
            },
          ]),
        );
        localStorage.setItem("fastmlx.chat.current", "seeded");
      }, SMOL);
      await page.goto(`${server.base}/ui/#/chat`);
      const reply = page.locator("[data-testid=message][data-role=assistant]");
      await reply.waitFor();
      const md = reply.getByTestId("message-content");
      assert.equal(await md.locator("strong").textContent(), "bold");
      assert.equal(await md.locator("a").getAttribute("target"), "_blank");
      assert.equal(await md.locator("script").count(), 0);
      assert.equal(await md.locator("img").getAttribute("onerror"), null);
      assert.equal(await page.evaluate(() => window.__xss), undefined, "no script ran");
      const reasoning = reply.getByTestId("reasoning");
      assert.equal(await reasoning.evaluate((d) => d.open), false, "reasoning folded");
      await reasoning.locator("summary").click();
      assert.equal(await reasoning.evaluate((d) => d.open), true);
      assert.equal(await page.getByTestId("chat-system").inputValue(), "Be brief.");
      // Highlighted in the fence's language; the copy is still the plain code.
      const code = md.locator("pre code");
      assert.equal(await code.getAttribute("data-language"), "python");
      assert.equal(await code.locator(".hljs-built_in").first().textContent(), "print");
      assert.equal(await code.locator(".hljs-string").first().textContent(), "'hi'");
      const tokenColor = await code.locator(".hljs-string").first().evaluate((e) => getComputedStyle(e).color);
      const plainColor = await code.evaluate((e) => getComputedStyle(e).color);
      assert.notEqual(tokenColor, plainColor, "strings coloured");
      await md.getByTestId("code-copy").click();
      assert.equal(await page.evaluate(() => navigator.clipboard.readText()), "print('hi')\n");
      await screenshot(page, "chat-markdown");
      assertClean(page);
    } finally {
      await context.close();
    }
  });

  test("chat: tools offered, the model's call shown, its result sent back", async () => {
    const { context, page } = await open("chat");
    try {
      const select = page.getByTestId("chat-model");
      await until(async () => (await select.locator("option").allTextContents()).some((t) => t.includes(SMOL)), "the model list");
      await page.getByTestId("chat-new").click();
      await select.selectOption(SMOL);
      await page.getByTestId("chat-temperature").fill("0");
      await page.getByTestId("chat-max-tokens").fill("40");
      await page.getByTestId("chat-tools-toggle").click();
      const tools = page.getByTestId("chat-tools-input");
      await tools.fill("[{\"name\": \"get_weather\"");
      assert.match(await text(page.getByTestId("chat-tools-error")), /^Not sent: not JSON/);
      // A bare function is taken as the tool wrapping it; an enum keeps the forced call short.
      const weather = { name: "get_weather", description: "The weather in a city",
        parameters: { type: "object", properties: { city: { type: "string", enum: ["Paris", "Oslo"] } }, required: ["city"] } };
      await tools.fill(JSON.stringify([weather]));
      assert.equal(await text(page.getByTestId("chat-tools-count")), "1 tool offered");
      assert.equal(await text(page.getByTestId("chat-tools-toggle")), "Tools (1)");
      await page.getByTestId("chat-tools-force").check();

      const bodies = [];
      page.on("request", (r) => r.url().endsWith("/v1/chat/completions") && bodies.push(r.postDataJSON()));
      await page.getByTestId("chat-input").fill("What is the weather in Paris?");
      await page.getByTestId("chat-send").click();
      const call = page.getByTestId("tool-call");
      await call.waitFor({ timeout: 120_000 });
      await page.getByTestId("tool-results").waitFor({ timeout: 120_000 });
      assert.equal(await call.getAttribute("data-name"), "get_weather");
      assert.deepEqual(JSON.parse(await text(call.getByTestId("tool-call-arguments"))), { city: "Paris" });
      assert.deepEqual(bodies[0].tools, [{ type: "function", function: weather }]);
      assert.equal(bodies[0].tool_choice, "required");
      // Sent whole once parsed: its speed is over the whole request, not one chunk's instant.
      const rate = Number((await text(page.getByTestId("reply-stats").first())).match(/([\d.]+) tok\/s/)?.[1]);
      assert.ok(rate > 0 && rate < 1000, `a believable speed: ${rate}`);
      await screenshot(page, "chat-tool-call");

      // The result goes back as a tool message answering the call; the model goes on.
      await page.getByTestId("chat-tools-force").uncheck();
      await page.getByTestId("tool-result-input").fill('{"temperature_c": 21, "sky": "clear"}');
      await page.getByTestId("tool-results-send").click();
      await page.getByTestId("tool-result").waitFor();
      const answer = page.locator("[data-testid=message][data-role=assistant]").last();
      await until(async () => (await page.getByTestId("message").count()) === 4 && (await answer.getAttribute("data-streaming")) === "false", "the answer after the result", { timeout: 120_000 });
      assert.deepEqual(bodies[1].messages.map((m) => m.role), ["user", "assistant", "tool"]);
      const [, assistant, result] = bodies[1].messages;
      assert.equal(assistant.role, "assistant");
      assert.equal(assistant.tool_calls[0].function.name, "get_weather");
      assert.deepEqual(result, { role: "tool", tool_call_id: assistant.tool_calls[0].id, content: '{"temperature_c": 21, "sky": "clear"}' });
      assert.equal(bodies[1].tool_choice, undefined, "no longer forced");
      assert.equal(await answer.getByTestId("message-error").count(), 0);
      assert.ok(Number(await answer.getByTestId("reply-stats").getAttribute("data-tokens")) > 0, "the model answered");

      // Kept across a reload, calls and result included (saved shortly after the answer ends).
      await until(
        () => page.evaluate(() => (localStorage.getItem("fastmlx.chats") ?? "").includes('"role":"tool"')),
        "the conversation saved",
      );
      await page.reload();
      await page.getByTestId("tool-result").waitFor();
      assert.equal(await page.getByTestId("tool-call").count(), (await answer.getByTestId("tool-call").count()) + 1);
      assertClean(page);
    } finally {
      await context.close();
    }
  });

  test("chat: images attached, pasted and dropped, answered by a model that sees, kept", async () => {
    // The tiny Qwen3-VL of tests/vision.rs, found with the other models.
    const vl = "tiny_qwen3_vl";
    cpSync(path.join(root, "tests/data/vision", vl), path.join(server.modelsDir, vl), { recursive: true });
    const { context, page } = await open("chat");
    try {
      const select = page.getByTestId("chat-model");
      await until(async () => (await select.locator("option").allTextContents()).some((t) => t.includes(vl)), "the model list");
      await page.getByTestId("chat-new").click();
      await select.selectOption(vl);
      await page.getByTestId("chat-temperature").fill("0");
      await page.getByTestId("chat-max-tokens").fill("12");
      const small = path.join(root, "tests/data/vision/small.png");
      // Picked: an image and a file that is not one.
      await page.getByTestId("chat-attach-input").setInputFiles([small, path.join(root, "README.md")]);
      await until(async () => (await page.getByTestId("attachment").count()) === 1, "the picked image");
      assert.match(await text(page.getByTestId("attach-error")), /README\.md: not a PNG, JPEG, WebP or GIF image/);
      // Pasted and dropped, as a screenshot tool and a file manager give them.
      const png = readFileSync(path.join(root, "tests/data/vision/tall.png")).toString("base64");
      await page.evaluate((b64) => {
        const file = () => new File([Uint8Array.from(atob(b64), (c) => c.charCodeAt(0))], "shot.png", { type: "image/png" });
        const paste = new DataTransfer();
        paste.items.add(file());
        document.querySelector("[data-testid=chat-input]").dispatchEvent(new ClipboardEvent("paste", { clipboardData: paste, bubbles: true }));
        const drop = new DataTransfer();
        drop.items.add(file());
        document.querySelector("[data-testid=composer]").dispatchEvent(new DragEvent("drop", { dataTransfer: drop, bubbles: true }));
      }, png);
      await until(async () => (await page.getByTestId("attachment").count()) === 3, "the pasted and dropped images");
      assert.equal(await page.getByTestId("attach-text-only").count(), 0, "this model sees");
      await page.getByTestId("attachment-remove").last().click();
      assert.equal(await page.getByTestId("attachment").count(), 2);

      const bodies = [];
      page.on("request", (r) => r.url().endsWith("/v1/chat/completions") && bodies.push(r.postDataJSON()));
      await page.getByTestId("chat-input").fill("What is this?");
      await page.getByTestId("chat-send").click();
      const answer = page.locator("[data-testid=message][data-role=assistant]").last();
      await until(async () => (await answer.getAttribute("data-streaming")) === "false" && (await answer.getByTestId("reply-stats").count()) === 1, "the answer", { timeout: 120_000 });
      assert.equal(await answer.getByTestId("message-error").count(), 0);
      assert.ok(Number(await answer.getByTestId("reply-stats").getAttribute("data-tokens")) > 0, "the model answered");
      const parts = bodies[0].messages[0].content;
      assert.deepEqual(parts.map((p) => p.type), ["image_url", "image_url", "text"]);
      assert.ok(parts[0].image_url.url.startsWith("data:image/png;base64,"));
      assert.equal(await page.getByTestId("attachment").count(), 0, "sent with the message");
      assert.equal(await page.getByTestId("message-image").count(), 2);
      await screenshot(page, "chat-images");

      // Kept across a reload, the images shown with the message.
      await until(
        () => page.evaluate(() => (localStorage.getItem("fastmlx.chats") ?? "").includes("data:image/png;base64,")),
        "the conversation saved",
      );
      await page.reload();
      await page.getByTestId("message-image").first().waitFor();
      assert.equal(await page.getByTestId("message-image").count(), 2);
      assertClean(page);
    } finally {
      await context.close();
    }
  });

  test("live: charts move and recent requests appear while requests run", async () => {
    const { context, page } = await open("live");
    try {
      await page.locator("[data-testid=live-connected][data-connected=true]").waitFor({ timeout: 15_000 });
      const series = (id) =>
        page.getByTestId(id).evaluate((el) => el.__uplot.data.map((s) => Array.from(s)));
      const before = await series("chart-tokens");
      const recentBefore = await page.getByTestId("recent-row").count();
      assert.ok(before[0].length >= 1, "the chart has samples");

      // Four requests at once, sent from here.
      const requests = Array.from({ length: 4 }, (_, i) =>
        api(server, "/v1/chat/completions", {
          method: "POST",
          json: {
            model: SMOL,
            messages: [{ role: "user", content: `Tell me a short fact about the number ${i + 7}.` }],
            max_tokens: 40,
            temperature: 0,
          },
        }),
      );
      let sawDecode = 0;
      let sawBatch = 0;
      const done = Promise.all(requests).then(() => true);
      let finished = false;
      done.then(() => (finished = true));
      while (!finished) {
        const [x, , decode] = await series("chart-tokens");
        const [, batch] = await series("chart-batch");
        sawDecode = Math.max(sawDecode, ...decode.filter((v) => v != null));
        sawBatch = Math.max(sawBatch, ...batch.filter((v) => v != null));
        assert.ok(x.length > 0);
        await page.waitForTimeout(250);
      }
      await done;
      await page.waitForTimeout(1200);
      const after = await series("chart-tokens");
      assert.ok(after[0].at(-1) > before[0].at(-1), "new samples plotted");
      const decodeAfter = after[2].filter((v) => v != null);
      sawDecode = Math.max(sawDecode, ...decodeAfter);
      assert.ok(sawDecode > 0, "decode tokens/s plotted above zero");
      assert.notDeepEqual(after[2], before[2], "the decode data changed");
      assert.ok(sawBatch >= 1, "a running batch plotted");
      // held, MLX active, buffer cache, KV, step predicted, step measured, ceiling.
      const memory = await series("chart-memory");
      assert.equal(memory.length, 8);
      assert.ok(memory[1].some((v) => v > 0), "held memory plotted");
      assert.ok(memory[2].some((v) => v > 0), "MLX memory plotted");
      assert.ok(memory[6].some((v) => v > 0), "a measured step plotted");
      const last = memory[0].length - 1;
      assert.ok(memory[7][last] > 0 && memory[7][last] >= memory[1][last], "the ceiling above what is held");
      assert.match(await text(page.getByTestId("memory-summary")), /ceiling [\d.]+ \w?B.*parked \d+.*refused \d+ waited · \d+ memory/s);

      await until(async () => (await page.getByTestId("recent-row").count()) >= Math.min(50, recentBefore + 4), "the recent requests");
      const rows = await page.getByTestId("recent-row").allTextContents();
      assert.ok(rows.slice(0, 4).every((r) => r.includes(SMOL)));
      const summary = page.locator(`[data-testid=model-summary-row][data-model="${SMOL}"]`);
      await summary.waitFor();

      // The same prompt again: its row shows the reused tokens, the model its hit rate and cache size.
      const again = {
        model: SMOL,
        messages: [{ role: "user", content: "Tell me a short fact about the number 7." }],
        max_tokens: 8,
        temperature: 0,
      };
      const answer = await api(server, "/v1/chat/completions", { method: "POST", json: again });
      const reused = answer.usage.prompt_tokens_details.cached_tokens;
      assert.ok(reused > 0, "a prefix-cache hit");
      await until(async () => (await text(page.getByTestId("recent-reused").first())).startsWith(String(reused)), "the reused tokens shown");
      assert.match(await text(summary.getByTestId("prefix-cache")), /\d+% · \d+ tok · [\d.]+ \w?B/);
      // A prompt that repeats itself: tokens drafted, and the share accepted shown for the model.
      const repeat = {
        model: SMOL,
        messages: [{ role: "user", content: "Repeat exactly: red green blue, red green blue, red green blue, red green blue" }],
        max_tokens: 32,
        temperature: 0,
      };
      const drafted = await api(server, "/v1/chat/completions", { method: "POST", json: repeat });
      assert.ok(drafted.timings.draft_n > 0, `tokens drafted: ${JSON.stringify(drafted.timings)}`);
      await until(async () => /^\d+ % of \d+$/.test(await text(summary.getByTestId("drafts"))), "the drafts' acceptance shown");
      assert.ok((await page.getByTestId("waterfall").count()) >= 1, "each request shows where its time went");
      await screenshot(page, "live");

      // A Live page opened after the traffic starts from the server's history.
      const later = await open("live");
      try {
        await later.page.locator("[data-testid=live-connected][data-connected=true]").waitFor({ timeout: 15_000 });
        const [x, , decode] = await later.page.getByTestId("chart-tokens").evaluate((el) => el.__uplot.data.map((s) => Array.from(s)));
        assert.ok(x.length > 5, `samples from before the page opened: ${x.length}`);
        assert.ok(decode.some((v) => v > 0), "the decode rate of the earlier requests");
      } finally {
        await later.context.close();
      }
      assertClean(page);
    } finally {
      await context.close();
    }
  });

  test("discover: search with fit badges, download with progress, cancel, resume, done", async () => {
    const { context, page } = await open("discover");
    try {
      page.on("dialog", (d) => d.accept());
      // The Hub's errors are shown.
      await page.getByTestId("search-input").fill("explode");
      await page.getByTestId("search-button").click();
      await page.getByTestId("error").waitFor();

      await page.getByTestId("search-input").fill("mlx");
      await page.getByTestId("search-input").press("Enter");
      const hit = (id) => page.locator(`[data-testid=search-hit][data-repo="${id}"]`);
      await hit(TINY_REPO).waitFor();
      assert.equal(await page.getByTestId("error").count(), 0, "the error is gone");
      const order = await page.getByTestId("search-hit").evaluateAll((els) => els.map((e) => e.dataset.repo));
      assert.deepEqual(order, [TIGHT_REPO, HUGE_REPO, TINY_REPO, OTHER_REPO], "most downloaded first");
      assert.equal(await text(hit(TINY_REPO).getByTestId("fit-badge")), "fits");
      assert.equal(await text(hit(TIGHT_REPO).getByTestId("fit-badge")), "tight");
      assert.equal(await text(hit(HUGE_REPO).getByTestId("fit-badge")), "too big");
      // A repo with a config.json: its type and the context it would serve here, from the planner.
      assert.equal(await text(hit(TINY_REPO).getByTestId("model-type")), "qwen2");
      assert.match(await text(hit(TINY_REPO).getByTestId("plan-context")), /^4 × [\d.]+k? ctx\s*$/);
      assert.equal(await hit(TIGHT_REPO).getByTestId("plan-context").count(), 0, "no config.json, no plan");
      assert.equal(await text(hit(TIGHT_REPO).getByTestId("quant-badge")), "BF16", "from the repo name");
      assert.equal(await text(hit(TINY_REPO).getByTestId("quant-badge")), "F32", "from the dtypes");
      assert.match(await text(hit(TINY_REPO)), /↓ 1\.2K/);
      assert.match(await text(hit(HUGE_REPO)), /810 GB/);
      // Filters narrow the results: a family, then only what fits and loads here.
      await page.getByTestId("filter-family").selectOption("qwen2");
      assert.deepEqual(await page.getByTestId("search-hit").evaluateAll((els) => els.map((e) => e.dataset.repo)), [TINY_REPO]);
      await page.getByTestId("filter-family").selectOption("");
      await page.getByTestId("filter-fits").check();
      const fitting = await page.getByTestId("search-hit").evaluateAll((els) => els.map((e) => e.dataset.repo));
      assert.deepEqual(fitting, [TINY_REPO, OTHER_REPO]);
      await page.getByTestId("filter-fits").uncheck();

      // Download, slowly: progress shows, then cancel.
      hub.setDelay(150);
      await hit(TINY_REPO).getByTestId("download").click();
      const pull = hit(TINY_REPO).getByTestId("pull");
      const progress = await until(async () => {
        const t = await text(pull.getByTestId("progress-text"));
        return /^[1-9]\d*% of [\d.]+ MB · [\d.]+ MB\/s/.test(t) && t;
      }, "the progress with its speed", { timeout: 60_000 });
      assert.match(progress, /\(\d\/\d\)/, "files done of total");
      await screenshot(page, "discover");
      await pull.getByTestId("cancel").click();
      await hit(TINY_REPO).locator("[data-testid=pull][data-state=cancelled]").waitFor({ timeout: 30_000 });
      assert.match(await text(pull.getByTestId("pull-message")), /cancelled at \d+%/);
      assert.ok(!(await api(server, "/admin/models")).some((m) => m.id === TINY_REPO), "not visible before it is complete");

      // Resume, faster, to the end; the model is then on the Models page, FastMLX's own.
      hub.setDelay(2);
      await pull.getByTestId("resume").click();
      await hit(TINY_REPO).locator("[data-testid=pull][data-state=done]").waitFor({ timeout: 60_000 });
      await pull.getByRole("link", { name: "Open in Models" }).click();
      const row = page.locator(`[data-testid=model-row][data-model="${TINY_REPO}"]`);
      await row.waitFor();
      assert.match(await text(row), /qwen2/);
      // Downloaded by FastMLX: deleted without the force question.
      await row.getByTestId("delete").click();
      await row.waitFor({ state: "detached", timeout: 30_000 });
      assert.equal(await page.getByTestId("delete-anyway").count(), 0);
      assertClean(page);
    } finally {
      await context.close();
    }
  });

  test("discover: a pull running on the server is followed again after a reload", async () => {
    hub.setDelay(100);
    // Started elsewhere (as by the CLI or another window), its stream left after one event.
    const res = await fetch(`${server.base}/admin/pull`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ repo: OTHER_REPO }) });
    assert.equal(res.status, 200);
    const reader = res.body.getReader();
    await reader.read();
    await reader.cancel();
    const { context, page } = await open("discover");
    try {
      const row = page.locator(`[data-testid=pull-row][data-repo="${OTHER_REPO}"]`);
      await row.locator("[data-testid=pull][data-state=running]").waitFor({ timeout: 15_000 });
      hub.setDelay(2);
      await row.locator("[data-testid=pull][data-state=done]").waitFor({ timeout: 60_000 });
      assert.ok((await api(server, "/admin/models")).some((m) => m.id === OTHER_REPO));
      assertClean(page);
    } finally {
      await context.close();
    }
  });

  test("discover: opens on recommendations for this Mac; one click downloads and serves", async () => {
    const { context, page } = await open("discover");
    try {
      const card = (repo) => page.locator(`[data-testid=rec-model][data-repo="${repo}"]`);
      await card(REC_REPO).waitFor();
      const order = await page.getByTestId("rec-model").evaluateAll((els) => els.map((e) => e.dataset.repo));
      assert.equal(order[0], REC_REPO, "the one that fits first");
      assert.equal(await text(card(REC_REPO).getByTestId("rec-fit")), "fits");
      assert.equal(await text(card(REC_TOO_BIG).getByTestId("rec-fit")), "too big");
      assert.match(await text(card(REC_REPO).getByTestId("plan-context")), /^4 × [\d.]+k? ctx/);
      assert.equal(await page.getByTestId("offline-note").count(), 0, "the fake Hub answers");
      await screenshot(page, "discover-recommended");

      hub.setDelay(2);
      await card(REC_REPO).getByTestId("rec-get").click();
      await card(REC_REPO).getByTestId("rec-serving").waitFor({ timeout: 60_000 });
      const status = await api(server, "/admin/status");
      assert.ok(status.loaded.some((m) => m.id === REC_REPO), "served after the download");
      // Searching leaves the list; "Recommended" brings it back, marked as on disk.
      await page.getByTestId("search-input").fill("tiny-recommended");
      await page.getByTestId("search-button").click();
      await page.locator(`[data-testid=search-hit][data-repo="${REC_REPO}"]`).waitFor();
      await page.getByTestId("back-to-recommended").click();
      await card(REC_REPO).getByTestId("rec-serving").waitFor();
      await fetch(`${server.base}/admin/unload`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ model: REC_REPO }) });
      assertClean(page);
    } finally {
      await context.close();
    }
  });

  test("discover: plans for a Mac of 8, 16, 32 and 128 GB, the best that fits first", async () => {
    const { context, page } = await open("discover");
    try {
      await page.getByTestId("rec-model").first().waitFor();
      // What each machine can hold: the 8B at 16 bits needs 16 GB of weights (more than a 16 GB
      // Mac's 11.2 GB share), the 70B at 4.5 bits 40 GB (more than a 32 GB Mac's 22.4 GB).
      const expected = {
        8: { [REC_REPO]: true, [REC_MID]: false, [REC_LARGE]: false, [REC_TOO_BIG]: false },
        16: { [REC_REPO]: true, [REC_MID]: false, [REC_LARGE]: false, [REC_TOO_BIG]: false },
        32: { [REC_REPO]: true, [REC_MID]: true, [REC_LARGE]: false, [REC_TOO_BIG]: false },
        128: { [REC_REPO]: true, [REC_MID]: true, [REC_LARGE]: true, [REC_TOO_BIG]: false },
      };
      const rank = { fits: 0, tight: 1, "too big": 2 };
      for (const [gb, fitting] of Object.entries(expected)) {
        await page.getByTestId("rec-machine").selectOption(gb);
        const article = gb === "8" ? "an" : "a";
        await until(async () => (await text(page.locator(".rec-head h2"))) === `Recommended for ${article} ${gb} GB Mac`, `the ${gb} GB plan`);
        const cards = () => page.getByTestId("rec-model").evaluateAll((els) => els.map((e) => [e.dataset.repo, e.dataset.fit]));
        // The list is swapped when the server answers: wait for this machine's badges, in their
        // settled order (a render caught midway once showed the new badges in the old order).
        const settled = (now) => {
          const ranks = now.map(([, fit]) => rank[fit]);
          return ranks.every((r, i) => i === 0 || ranks[i - 1] <= r);
        };
        const fits = await until(async () => {
          const now = await cards();
          const ok = now.length === 4 && now.every(([repo, fit]) => (fit !== "too big") === fitting[repo]);
          return ok && settled(now) && now;
        }, `badges for ${gb} GB, best first: ${JSON.stringify(fitting)}`);
        const ranks = fits.map(([, fit]) => rank[fit]);
        assert.deepEqual(ranks, [...ranks].sort(), `${gb} GB: the best that fits first: ${JSON.stringify(fits)}`);
        const served = await api(server, `/admin/recommended?machine_gb=${gb}`);
        assert.equal(served.ceiling_bytes, Math.floor((Number(gb) * 2 ** 30) / 100) * 70, "70 % of the machine");
        if (gb === "8") await screenshot(page, "discover-8gb");
      }
      await page.getByTestId("rec-machine").selectOption("");
      await until(async () => (await text(page.locator(".rec-head h2"))) === "Recommended for this Mac", "back to this Mac");
      const bad = await fetch(`${server.base}/admin/recommended?machine_gb=lots`);
      assert.equal(bad.status, 400);
      assert.match((await bad.json()).error.message, /invalid query string/);
      const huge = await fetch(`${server.base}/admin/recommended?machine_gb=5000`);
      assert.equal((await huge.json()).error.param, "machine_gb");
      assertClean(page);
    } finally {
      await context.close();
    }
  });

  test("discover: offline, the list still shows, with a note; a first run opens on it", async () => {
    const { context, page } = await openPage(browser);
    try {
      await page.route("**/admin/hub", (route) =>
        route.fulfill({ json: { endpoint: "https://huggingface.co", reachable: false, error: "dns error: failed to lookup address" } }),
      );
      // No model on disk: the app opens on Discover rather than an empty table.
      await page.route("**/admin/models", (route) => route.fulfill({ json: [] }));
      await page.goto(`${server.base}/ui/`);
      await page.getByTestId("page-discover").waitFor();
      await page.getByTestId("rec-model").first().waitFor();
      assert.match(await text(page.getByTestId("offline-note")), /cannot be reached \(dns error.*downloading needs a connection/s);
      await screenshot(page, "discover-offline");
    } finally {
      await context.close();
    }
  });

  /** A cluster status's figures before any step was timed. */
  const untimed = () => ({
    prompt: { steps: 0, sum_seconds: 0, step_seconds: 0 },
    decode: { steps: 0, sum_seconds: 0, step_seconds: 0 },
  });
  /** `/admin/status` answered with one model, served by `cluster` (rank 0's status, as live). */
  const serveStatusOf = (page, cluster) => {
    const model = {
      id: "qwen", kind: "chat", path: "/m/qwen", memory_bytes: 1e9, weights_bytes: 9e8, kv_budget_bytes: 1e8,
      idle_secs: 1, expires_in_secs: null, running: 0, queued: 0, context_length: 4096, cluster,
    };
    return page.route("**/admin/status", (route) => route.fulfill({ json: { loaded: [model], waiting: null } }));
  };

  test("server: a cluster's machine that is back is taken in when asked", async () => {
    const { context, page } = await openPage(browser);
    try {
      // The status of rank 0 serving alone, rank 1 back, `--take-back asked` (a cluster cannot
      // run in this suite; tests/cluster_serve.rs runs the real one).
      const cluster = {
        backend: "ring", parallel: "pipeline",
        nodes: [{ rank: 0, host: "10.0.0.1:32323", room_bytes: 8e9, first_layer: 0, end_layer: 30, ends: true }],
        links: [], without: ["rank 1 (10.0.0.2:32323)"], back: ["rank 1 (10.0.0.2:32323)"], take_back: "asked",
        steps: 0, tokens: 0, bytes_per_hop: 0, wait_seconds: 0, step_seconds: 0,
        sums_timed: untimed(),
      };
      await serveStatusOf(page, cluster);
      const asked = [];
      await page.route("**/admin/cluster/take-back", (route) => {
        asked.push(route.request().method());
        return route.fulfill({ status: 202, json: { taking_back: cluster.back } });
      });
      await page.goto(`${server.base}/ui/#/server`);
      await page.getByTestId("cluster-back").waitFor();
      assert.match(await text(page.getByTestId("cluster-without")), /taken back once it returns and you take it back here/);
      assert.match(await text(page.getByTestId("cluster-back")), /rank 1 \(10\.0\.0\.2:32323\) is back\. Taking it in reloads/);
      await page.getByTestId("cluster-take-back").click();
      await page.waitForFunction(() => document.querySelector("[data-testid=cluster-take-back]")?.disabled);
      assert.deepEqual(asked, ["POST"]);
      assert.equal(await text(page.getByTestId("cluster-take-back")), "Taking back…");
      await screenshot(page, "cluster-back");
    } finally {
      await context.close();
    }
  });

  test("server: a machine held off after a failed take-in can be taken back sooner", async () => {
    const { context, page } = await openPage(browser);
    try {
      // Rank 0 serving alone; rank 1 back, but its take-in failed 1 min ago (held off 5 min).
      const cluster = {
        backend: "ring", parallel: "pipeline",
        nodes: [{ rank: 0, host: "10.0.0.1:32323", room_bytes: 8e9, first_layer: 0, end_layer: 30, ends: true }],
        links: [], without: ["rank 1 (10.0.0.2:32323)"], held: [{ machine: "rank 1 (10.0.0.2:32323)", seconds_left: 239 }],
        take_back: "idle", steps: 0, tokens: 0, bytes_per_hop: 0, wait_seconds: 0, step_seconds: 0,
        sums_timed: untimed(),
      };
      await serveStatusOf(page, cluster);
      const asked = [];
      await page.route("**/admin/cluster/take-back", (route) => {
        asked.push(route.request().method());
        return route.fulfill({ status: 202, json: { taking_back: ["rank 1 (10.0.0.2:32323)"] } });
      });
      await page.goto(`${server.base}/ui/#/server`);
      await page.getByTestId("cluster-back").waitFor();
      assert.match(
        await text(page.getByTestId("cluster-back")),
        /rank 1 \(10\.0\.0\.2:32323\) is back, held off since its last take-in failed: tried again by itself in 4 min, or now if you take it back\. Taking it in reloads/,
      );
      await page.getByTestId("cluster-take-back").click();
      await page.waitForFunction(() => document.querySelector("[data-testid=cluster-take-back]")?.disabled);
      assert.deepEqual(asked, ["POST"]);
      // Under `--take-back asked`, with another machine back beside it: nothing is said to come
      // by itself.
      await page.unroute("**/admin/status");
      await serveStatusOf(page, { ...cluster, take_back: "asked", back: ["rank 2 (10.0.0.3:32323)"] });
      await page.reload();
      await page.getByTestId("cluster-back").waitFor();
      const both = await text(page.getByTestId("cluster-back"));
      assert.match(both, /rank 2 \(10\.0\.0\.3:32323\) is back\. rank 1 \(10\.0\.0\.2:32323\) is back, held off since its last take-in failed: take it back once its cause is mended\. Taking them in/);
      assert.doesNotMatch(both, /by itself/);
    } finally {
      await context.close();
    }
  });

  test("server: a cluster by tensors shows the time in its sums, once timed", async () => {
    const { context, page } = await openPage(browser);
    try {
      // Rank 0's status by tensors over 2 machines (tests/cluster_serve.rs runs the real one).
      const node = (rank) => ({ rank, host: `10.0.0.${rank + 1}:32323`, room_bytes: 8e9, first_layer: 0, end_layer: 28, ends: true });
      const cluster = {
        backend: "ring", parallel: "tensor", nodes: [node(0), node(1)],
        links: [{ from: 0, to: 1, round_trip_ms: 0.12, megabytes_per_second: 1800 }], without: [],
        steps: 100, tokens: 800, bytes_per_hop: 4e6, wait_seconds: 2.0, step_seconds: 2.5,
        sums_timed: untimed(),
      };
      await serveStatusOf(page, cluster);
      await page.goto(`${server.base}/ui/#/server`);
      await page.getByTestId("cluster-sums").waitFor();
      assert.match(await text(page.getByTestId("cluster-steps")), /100 steps .* step 25 ms/);
      assert.equal(await text(page.getByTestId("cluster-sums")), "the sums with the other machines not timed yet");
      cluster.sums_timed.decode = { steps: 4, sum_seconds: 0.03, step_seconds: 0.12 };
      await page.reload();
      await page.getByText("(4 timed)").waitFor();
      assert.equal(await text(page.getByTestId("cluster-sums")), "in the sums with the other machines: decode 7.50 ms of a 30 ms step (4 timed)");
      cluster.sums_timed.prompt = { steps: 1, sum_seconds: 0.066, step_seconds: 0.218 };
      await page.reload();
      await page.getByText("(1 timed)").waitFor();
      assert.equal(
        await text(page.getByTestId("cluster-sums")),
        "in the sums with the other machines: decode 7.50 ms of a 30 ms step (4 timed), prompt 66 ms of a 218 ms step (1 timed)",
      );
    } finally {
      await context.close();
    }
  });

  test("a model's page: shape, memory here with and without KV quantization, files, client configs", async () => {
    const { context, page } = await open("models");
    try {
      await page.locator('[data-testid=model-row][data-model="tiny-llama"] [data-testid=model-link]').click();
      await page.getByTestId("page-model").waitFor();
      assert.equal(await text(page.getByTestId("model-page-id")), "tiny-llama");
      await page.getByTestId("model-config").waitFor();
      assert.match(await text(page.getByTestId("model-config")), /Familyllama.*Layers2/s);
      assert.match(await text(page.getByTestId("model-memory")), /KV per 1k tokens/);
      assert.match(await text(page.getByTestId("model-context")), /Context for 4 requests/);
      assert.match(await text(page.getByTestId("model-files")), /config\.json/);
      assert.match(await text(page.getByTestId("model-snippet-codex")), /tiny-llama/);
      await screenshot(page, "model");
      assertClean(page);
    } finally {
      await context.close();
    }
  });

  test("look: every page in light and dark, wide and narrow, none wider than its window", async () => {
    for (const colorScheme of ["light", "dark"]) {
      for (const width of [1280, 420]) {
        const { context, page } = await openPage(browser, { viewport: { width, height: 820 }, colorScheme });
        try {
          for (const [route, hash] of [["models"], ["discover"], ["live"], ["server"], ["chat"], ["model", "model?id=tiny-llama"]]) {
            await page.goto(`${server.base}/ui/#/${hash ?? route}`);
            await page.getByTestId(`page-${route}`).waitFor();
            await page.waitForTimeout(400); // the data arrives (the Live page streams: never idle)
            const bg = await page.evaluate(() => getComputedStyle(document.documentElement).backgroundColor);
            const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
            assert.ok(overflow <= 1, `${route} at ${width}px (${colorScheme}) is ${overflow}px wider than the window`);
            await screenshot(page, `${route}-${colorScheme}-${width}`);
            if (colorScheme === "dark") assert.ok(bg !== "rgb(255, 255, 255)", `${route}: dark background`);
          }
          assertClean(page);
        } finally {
          await context.close();
        }
      }
    }
  });

  test("server: settings saved and kept, snippets point here, API key stored", async () => {
    const { context, page } = await open("server");
    try {
      await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: server.base });
      await page.getByTestId("settings-form").waitFor();
      assert.equal(await text(page.getByTestId("api-url")), `${server.base}/v1`);
      assert.equal(await text(page.getByTestId("bind-port")), new URL(server.base).port);
      assert.equal(await page.getByTestId("max-batch").inputValue(), "8");

      await page.getByTestId("max-batch").fill("4");
      await page.getByTestId("keep-alive").fill("900");
      await page.getByTestId("settings-save").click();
      await page.getByTestId("settings-saved").waitFor();
      assert.match(await text(page.getByTestId("settings-saved")), /max batch 4.*keep-alive 900 s/);
      const settings = await api(server, "/admin/settings");
      assert.equal(settings.max_batch, 4);
      assert.equal(settings.keep_alive_secs, 900);

      await page.reload();
      await page.getByTestId("settings-form").waitFor();
      await until(async () => (await page.getByTestId("keep-alive").inputValue()) === "900", "keep-alive after reload");
      assert.equal(await page.getByTestId("max-batch").inputValue(), "4");

      // The prefix cache: its size saved like the rest, and cleared from here.
      await page.getByTestId("prefix-cache-mb").fill("256");
      await page.getByTestId("settings-save").click();
      await until(async () => (await api(server, "/admin/settings")).prefix_cache_mb === 256, "prefix cache size saved");
      await page.getByTestId("clear-prefix-cache").click();
      assert.match(await text(page.getByTestId("prefix-cache-cleared")), /Cleared for|No model loaded/);

      // Back to never unloading.
      await page.getByTestId("keep-alive").fill("");
      await page.getByTestId("settings-save").click();
      await page.getByTestId("settings-saved").waitFor();
      assert.equal((await api(server, "/admin/settings")).keep_alive_secs, null);

      // Snippets name this server, and copy puts them on the clipboard.
      const agents = ["codex", "continue", "opencode", "kilo", "qwen-code", "copilot", "pi", "grok"];
      for (const id of [...agents, "zed", "cline", "openwebui", "python"]) {
        assert.ok((await text(page.getByTestId(`snippet-${id}`))).includes(`${server.base}/v1`), `${id} snippet`);
      }
      // The coding agents' configurations are the files tests/agents runs them with, filled in.
      assert.ok((await text(page.getByTestId("snippet-claude-code"))).includes(`ANTHROPIC_BASE_URL=${server.base}\n`));
      assert.match(await text(page.getByTestId("snippet-codex")), /wire_api = "responses"/);
      // Claude Code is told the window the server serves.
      const served = (await api(server, "/admin/status")).loaded[0].context_length;
      assert.ok(served > 0);
      assert.ok((await text(page.getByTestId("snippet-claude-code"))).includes(`CLAUDE_CODE_MAX_CONTEXT_TOKENS=${served}\n`));
      assert.doesNotMatch(await text(page.getByTestId("snippet-opencode")), /\{(base|model|key)\}/);
      assert.match(await text(page.getByTestId("snippet-continue")), /provider: openai/);
      assert.match(await text(page.getByTestId("snippet-python")), /OpenAI\(base_url=/);
      await page.getByTestId("copy-python").click();
      const clip = await page.evaluate(() => navigator.clipboard.readText());
      assert.match(clip, /from openai import OpenAI/);

      // The API key field keeps the key in this browser.
      await page.getByTestId("api-key-input").fill("sk-local-test");
      await page.getByTestId("api-key-save").click();
      assert.equal(await page.evaluate(() => localStorage.getItem("fastmlx.apiKey")), "sk-local-test");
      await page.getByTestId("api-key-input").fill("");
      await page.getByTestId("api-key-save").click();
      assert.equal(await page.evaluate(() => localStorage.getItem("fastmlx.apiKey")), null);
      await screenshot(page, "server");
      assertClean(page);
    } finally {
      await context.close();
    }
  });
});
