// The real desktop app end to end (tests/desktop/harness.mjs starts it): loads the test model from
// the Models page, chats in the chat window (opened by the app's own `open_chat` command) and sees
// the streamed answer and attaches a pasted image, watches the Live graphs move while requests run, changes a setting and
// sees it applied.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { closeSync, openSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { api, attr, binary, click, exec, find, freePort, go, launch, quit, root, screenshot, SMOL, tmp, until, wd } from "./harness.mjs";

before(() =>
  launch({
    prepare: (models) => execFileSync(binary, ["make-test-model", "--arch", "llama", path.join(models, "tiny-llama")], { stdio: "ignore" }),
  }),
);

let worker;
after(async () => {
  worker?.kill("SIGKILL");
  await quit();
});

test("the dashboard window shows the UI with the app's API address", async () => {
  assert.match(await wd("GET", "/title"), /FastMLX/);
  const injected = await exec(`return window.__FASTMLX__;`);
  assert.match(injected.apiBase, /^http:\/\/127\.0\.0\.1:\d+$/);
  assert.equal(injected.desktop, true);
  assert.ok(await exec(`return typeof window.__TAURI__?.core?.invoke === "function";`), "Tauri's API is there");
});

test("models: load the test model from the Models page", async () => {
  await go("#/models");
  const row = '[data-testid=model-row][data-model="tiny-llama"]';
  await find(row);
  assert.equal(await attr(row, "data-loaded"), "false");
  await click(`${row} [data-testid=load]`);
  await until(async () => (await attr(row, "data-loaded")) === "true", "tiny-llama loaded");
  const status = await api("/admin/status");
  assert.ok(status.loaded.some((m) => m.id === "tiny-llama"));
  await until(async () => (await attr(`[data-testid=model-row][data-model="${SMOL}"]`, "data-loaded")) === "true", "the default model loaded");
  await screenshot("models");
});

test("chat: the chat window streams an answer", async () => {
  const dashboard = await wd("GET", "/window");
  await exec(`window.__TAURI__.core.invoke("open_chat");`);
  const chat = await until(async () => (await wd("GET", "/window/handles")).find((h) => h !== dashboard), "the chat window");
  await wd("POST", "/window", { handle: chat });
  assert.equal(await exec(`return location.hash;`), "#/chat");
  assert.equal(await exec(`return document.querySelector("[data-testid=nav]");`), null, "the chat window has no dashboard nav");
  await until(async () => exec(`return [...document.querySelectorAll("[data-testid=chat-model] option")].some(o => o.value === arguments[0]);`, [SMOL]), "the model list");
  await exec(
    `const s = document.querySelector("[data-testid=chat-model]"); s.value = arguments[0]; s.dispatchEvent(new Event("change", {bubbles: true}));`,
    [SMOL],
  );
  // Greedy and short: the tiny instruction model answers this one right.
  for (const [field, value] of [["chat-temperature", "0"], ["chat-max-tokens", "48"]]) {
    const el = await find(`[data-testid=${field}]`);
    await wd("POST", `/element/${el}/clear`, {});
    await wd("POST", `/element/${el}/value`, { text: value });
  }
  const input = await find("[data-testid=chat-input]");
  await wd("POST", `/element/${input}/value`, { text: "What is the capital of France?" });
  await wd("POST", `/element/${input}/value`, { text: "\uE007" }); // Enter
  const replyText = () => exec(`const m = [...document.querySelectorAll("[data-testid=message][data-role=assistant]")].pop(); return m ? m.textContent : "";`);
  const lengths = new Set();
  await until(async () => {
    const text = await replyText();
    if (text) lengths.add(text.length);
    return lengths.size >= 3;
  }, "the reply growing as it streams");
  let reply = "";
  try {
    await until(async () => /Paris/.test((reply = await replyText())), "Paris in the answer");
  } finally {
    await screenshot("chat");
  }
  assert.match(reply, /Paris/, reply);
  // A screenshot pasted into the chat window's page is attached (its remove button takes it off).
  const png = readFileSync(path.join(root, "tests/data/vision/small.png")).toString("base64");
  await exec(
    `const bytes = Uint8Array.from(atob(arguments[0]), (c) => c.charCodeAt(0));
     const data = new DataTransfer();
     data.items.add(new File([bytes], "shot.png", { type: "image/png" }));
     document.querySelector("[data-testid=chat-input]").dispatchEvent(new ClipboardEvent("paste", { clipboardData: data, bubbles: true }));`,
    [png],
  );
  await until(async () => (await exec(`return document.querySelectorAll("[data-testid=attachment] img").length;`)) === 1, "the pasted image attached");
  await click("[data-testid=attachment-remove]");
  await until(async () => (await exec(`return document.querySelectorAll("[data-testid=attachment]").length;`)) === 0, "the image removed");
  await wd("POST", "/window", { handle: dashboard });
});

test("live: the graphs move while requests run", async () => {
  await go("#/live");
  await find("[data-testid=live-connected][data-connected=true]");
  const decode = () => exec(`const u = document.querySelector("[data-testid=chart-tokens]").__uplot; return Array.from(u.data[2]);`);
  const before = await decode();
  const requests = Array.from({ length: 3 }, (_, i) =>
    api("/v1/chat/completions", {
      method: "POST",
      body: JSON.stringify({ model: SMOL, messages: [{ role: "user", content: `Count to ${i + 5}.` }], max_tokens: 32, temperature: 0 }),
    }),
  );
  let peak = 0;
  const done = Promise.all(requests);
  let finished = false;
  done.then(() => (finished = true));
  while (!finished) {
    peak = Math.max(peak, ...(await decode()).filter((v) => v != null));
    await new Promise((r) => setTimeout(r, 250));
  }
  await done;
  assert.ok(peak > 0, "decode tokens/s plotted above zero");
  assert.notDeepEqual(await decode(), before, "the plotted data changed");
  await until(async () => (await exec(`return document.querySelectorAll("[data-testid=recent-row]").length;`)) >= 3, "recent requests listed");
  await screenshot("live");
});

test("server: a changed setting is applied", async () => {
  await go("#/server");
  const batch = await find("[data-testid=max-batch]");
  await wd("POST", `/element/${batch}/clear`, {});
  await wd("POST", `/element/${batch}/value`, { text: "6" });
  await click("[data-testid=settings-save]");
  await find("[data-testid=settings-saved]");
  assert.equal((await api("/admin/settings")).max_batch, 6);
  await screenshot("server");
});

/** The menu's rows ({id, label, enabled}) as the app last drew them (its test build). */
const trayRows = () => exec(`return await window.__TAURI__.core.invoke("test_tray_menu");`);

test("cluster: started from the Server page, the menu names the machine it lost, stopped for the app to serve again", async () => {
  // Two ranks on loopback: this app is rank 0 (its child process serves the API on the app's
  // address), and the test starts rank 1 as the other Mac would, with the same list.
  const machines = [`127.0.0.1:${await freePort()}`, `127.0.0.1:${await freePort()}`];
  const hosts = path.join(tmp, "worker-hosts.json");
  writeFileSync(hosts, JSON.stringify(machines.map((m) => [m])));
  const log = openSync(path.join(root, "target/desktop-cluster-worker.log"), "w");
  const model = path.join(tmp, "models", "tiny-llama");
  // The app's environment (its config file, its marker for the teardown) is the worker's too.
  worker = spawn(binary, ["serve", "--cluster", hosts, "--rank", "1", "--model", model], {
    env: { ...process.env, FASTMLX_DESKTOP_TEST: path.basename(tmp), FASTMLX_CONFIG: path.join(tmp, "config.toml") },
    stdio: ["ignore", log, log],
  });
  closeSync(log);

  await go("#/server");
  await find("[data-testid=cluster-machines]");
  // A machine per line (the driver types no line breaks): set as the page's input would.
  await exec(`const a = document.querySelector("[data-testid=cluster-machines]"); a.value = ${JSON.stringify(machines.join("\n"))}; a.dispatchEvent(new Event("input", {bubbles: true}));`);
  await until(async () => exec(`return [...document.querySelectorAll("[data-testid=cluster-model] option")].some(o => o.value === "tiny-llama");`), "the model list");
  await exec(`const s = document.querySelector("[data-testid=cluster-model]"); s.value = "tiny-llama"; s.dispatchEvent(new Event("change", {bubbles: true}));`);
  await click("[data-testid=cluster-start]");
  try {
    await until(async () => (await attr("[data-testid=cluster-launch]", "data-running")) === "true", "the cluster's rank 0 running");
  } catch (e) {
    await screenshot("cluster-not-started");
    throw new Error(`${e.message}; the page says: ${await exec(`return document.querySelector("[data-testid=cluster-launch]").textContent;`)}`);
  }

  // Served across the two processes, on the app's own address: the page shows the Cluster card.
  const split = await until(async () => (await api("/admin/status")).loaded.find((m) => m.id === "tiny-llama" && m.cluster), "tiny-llama across the cluster", 120_000);
  assert.deepEqual(split.cluster.nodes.map((n) => n.host), machines);
  const answer = await api("/v1/chat/completions", {
    method: "POST",
    body: JSON.stringify({ model: "tiny-llama", messages: [{ role: "user", content: "Hi" }], max_tokens: 8, temperature: 0 }),
  });
  assert.equal(answer.usage.completion_tokens, 8);
  await find('[data-testid=cluster][data-model="tiny-llama"]');
  const rows = await until(async () => {
    const r = await trayRows();
    return r.some((row) => row.label === "Cluster: tiny-llama across 2 machines, this Mac rank 0") && r;
  }, "the cluster in the menu");
  assert.ok(rows.some((row) => row.id === "stop-cluster" && row.enabled), "Stop Cluster in the menu");
  assert.ok(!rows.some((row) => row.id === "toggle-server"), "the server is the cluster's meanwhile");
  await screenshot("cluster");

  // The other Mac gone: a request finds it lost, and the menu names it.
  worker.kill("SIGKILL");
  const base = await exec(`return window.__FASTMLX__.apiBase;`);
  const failed = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "tiny-llama", messages: [{ role: "user", content: "Hi" }], max_tokens: 8 }),
  });
  const refusal = await failed.text();
  assert.equal(failed.status, 503, refusal);
  // The fault names the machine gone (its presence at rank 0 closed with its process), and then
  // rank 0, started again in place, names it in what it waits for.
  assert.ok(refusal.includes(`rank 1 (${machines[1]}) is gone`), refusal);
  await until(async () => (await trayRows()).find((row) => row.label.startsWith("⚠") && row.label.includes(`waiting for rank 1 (${machines[1]})`)), "the lost machine in the menu", 60_000);

  // Stopped from the page: the app serves again on its address, on its own.
  await click("[data-testid=cluster-stop]");
  await until(async () => /ended: it stopped/.test(await exec(`return document.querySelector("[data-testid=cluster-child]")?.textContent ?? "";`)), "the page says it stopped");
  const alone = await until(async () => api("/admin/status"), "the app's own server again");
  assert.ok(!alone.waiting && !alone.loaded.some((m) => m.cluster), JSON.stringify(alone));
  const menu = await until(async () => {
    const r = await trayRows();
    return r.some((row) => row.id === "toggle-server") && r;
  }, "the menu without the cluster's server");
  assert.ok(menu.some((row) => row.label === "Cluster stopped (this Mac was rank 0): it stopped"), JSON.stringify(menu));
});
