// One streaming chat through the official `openai` npm package against a running
// `fastmlx serve` (started here on a free port with the default model). Run by scripts/test.sh:
//   node --test tests/clients/
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import path from "node:path";
import OpenAI from "openai";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const binary = process.env.FASTMLX_BIN ?? path.join(root, "target/debug/fastmlx");

function startServer() {
  return new Promise((resolve, reject) => {
    const proc = spawn(binary, ["serve", "--port", "0"], { stdio: ["ignore", "ignore", "pipe"] });
    let log = "";
    const timer = setTimeout(() => reject(new Error(`fastmlx serve did not start: ${log}`)), 120_000);
    proc.stderr.on("data", (chunk) => {
      log += chunk;
      const match = log.match(/at (http:\/\/\S+\/v1)/);
      if (match) {
        clearTimeout(timer);
        resolve({ proc, url: match[1] });
      }
    });
    proc.on("exit", (code) => reject(new Error(`fastmlx serve exited (${code}): ${log}`)));
  });
}

test("streaming chat with usage through openai-node", async () => {
  const { proc, url } = await startServer();
  try {
    const client = new OpenAI({ baseURL: url, apiKey: "any", maxRetries: 0 });
    const models = await client.models.list();
    const model = models.data[0].id;
    const stream = await client.chat.completions.create({
      model,
      messages: [{ role: "user", content: "What is the capital of France?" }],
      temperature: 0,
      max_tokens: 20,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let usage = null;
    let finish = null;
    for await (const chunk of stream) {
      if (chunk.choices.length > 0) {
        text += chunk.choices[0].delta.content ?? "";
        finish = chunk.choices[0].finish_reason ?? finish;
      }
      if (chunk.usage) usage = chunk.usage;
    }
    assert.match(text, /Paris/);
    assert.equal(finish, "stop");
    assert.ok(usage.prompt_tokens > 0 && usage.completion_tokens > 0);
    assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
    await assert.rejects(
      client.chat.completions.create({ model: "no-such-model", messages: [{ role: "user", content: "x" }] }),
      (e) => e instanceof OpenAI.NotFoundError,
    );
  } finally {
    proc.kill("SIGTERM");
  }
});
