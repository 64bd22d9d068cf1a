// The UI as the desktop app runs it: served from another origin than the API (Tauri's custom
// protocol), with window.__FASTMLX__ = {apiBase, apiKey, desktop} and window.__TAURI__ injected
// before the page loads. Here ui/dist is served by a small static server on another port, the
// API requires a key, and Tauri's invoke is a stub that records its calls.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { createServer } from "node:http";
import path from "node:path";
import { launchBrowser, openPage, root, startServer, until } from "./harness.mjs";

const KEY = "sk-desktop-test";
const types = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css" };

let server;
let browser;
let statics;
let origin;

before(async () => {
  statics = createServer(async (req, res) => {
    const name = new URL(req.url, "http://x").pathname.replace(/^\/$/, "/index.html");
    try {
      const body = await readFile(path.join(root, "ui/dist", path.normalize(name)));
      res.writeHead(200, { "Content-Type": types[path.extname(name)] ?? "application/octet-stream" });
      res.end(body);
    } catch {
      res.writeHead(404);
      res.end();
    }
  });
  await new Promise((resolve) => statics.listen(0, "127.0.0.1", resolve));
  origin = `http://127.0.0.1:${statics.address().port}`;
  server = await startServer({ tinyModels: [], args: ["--api-key", KEY, "--allowed-origin", origin], logName: "ui-tests-desktop-server.log" });
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await server?.stop();
  statics?.closeAllConnections();
  statics?.close();
});

async function openDesktop(route) {
  const { context, page } = await openPage(browser);
  await context.addInitScript(
    ([apiBase, apiKey]) => {
      window.__FASTMLX__ = { apiBase, apiKey, desktop: true };
      window.__invoked = [];
      window.__TAURI__ = {
        core: {
          invoke: async (name, args) => {
            window.__invoked.push([name, args ?? null]);
            return name === "get_launch_at_login" ? false : null;
          },
        },
      };
    },
    [server.base, KEY],
  );
  await page.goto(`${origin}/#/${route}`);
  await page.getByTestId(`page-${route}`).waitFor();
  return { context, page, invoked: () => page.evaluate(() => window.__invoked) };
}

describe("desktop app mode", { concurrency: false }, () => {
  test("the API key is required here", async () => {
    const res = await fetch(`${server.base}/admin/models`);
    assert.equal(res.status, 401);
  });

  test("dashboard: API on another origin with the injected key; native commands", async () => {
    const { context, page, invoked } = await openDesktop("models");
    try {
      await page.locator("[data-testid=model-row][data-loaded=true]").first().waitFor();
      // Chat opens in its own window through the app.
      await page.getByTestId("nav-chat").click();
      await until(async () => (await invoked()).some(([n]) => n === "open_chat"), "open_chat");

      await page.getByTestId("nav-server").click();
      await page.getByTestId("settings-form").waitFor();
      assert.equal(await page.getByTestId("api-key-set").textContent(), "required");
      const launch = page.getByTestId("launch-at-login");
      await launch.waitFor();
      assert.equal(await launch.isChecked(), false);
      await launch.check();
      await page.getByTestId("copy-url").click();
      await until(async () => {
        const calls = await invoked();
        return (
          calls.some(([n, a]) => n === "set_launch_at_login" && a.enabled === true) &&
          calls.some(([n, a]) => n === "copy_text" && a.text === `${server.base}/v1`)
        );
      }, "set_launch_at_login and copy_text");

      await page.getByTestId("nav-live").click();
      await page.locator("[data-testid=live-connected][data-connected=true]").waitFor({ timeout: 15_000 });
      assert.deepEqual(page.problems, []);
    } finally {
      await context.close();
    }
  });

  test("chat window: no dashboard navigation, streaming with the key", async () => {
    const { context, page, invoked } = await openDesktop("chat");
    try {
      assert.equal(await page.getByTestId("nav").count(), 0);
      await page.getByTestId("open-dashboard").click();
      await until(async () => (await invoked()).some(([n]) => n === "open_dashboard"), "open_dashboard");
      const select = page.getByTestId("chat-model");
      await until(async () => (await select.locator("option").allTextContents()).some((t) => t.includes("(loaded)")), "the model list");
      await page.getByTestId("chat-max-tokens").fill("8");
      await page.getByTestId("chat-input").fill("Say hello.");
      await page.getByTestId("chat-input").press("Enter");
      const stats = page.locator("[data-testid=message][data-role=assistant] [data-testid=reply-stats]");
      await stats.waitFor({ timeout: 60_000 });
      assert.ok(Number(await stats.getAttribute("data-tokens")) > 0);
      assert.equal(await page.getByTestId("message-error").count(), 0);
      assert.deepEqual(page.problems, []);
    } finally {
      await context.close();
    }
  });
});
