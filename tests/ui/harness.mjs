// Shared by the UI tests: a real `fastmlx serve` on a free port (the default SmolLM2 model loaded,
// tiny random-weight models in a temporary models folder, no other model folders), and Debian's
// Chromium driven headless through playwright-core.
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

export const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
export const binary = process.env.FASTMLX_BIN ?? path.join(root, "target/debug/fastmlx");
export const screenshots = path.join(root, "target/ui-screenshots");
const chromiumPath = process.env.CHROMIUM ?? "/usr/bin/chromium";

/** A tiny random-weight model folder made by `fastmlx make-test-model`. */
export function makeTinyModel(dir, arch = "llama") {
  execFileSync(binary, ["make-test-model", "--arch", arch, dir], { stdio: "ignore" });
  return dir;
}

/**
 * Starts the server with `tinyModels` (names) made by `fastmlx make-test-model --arch llama` in
 * its models folder, and `env` added to its environment; its log goes to target/`logName` when it
 * stops. Returns { url (…/v1), base, modelsDir,
 * log(), stop() }.
 */
export async function startServer({ tinyModels = ["tiny-llama"], args = [], env: extraEnv = {}, logName = "ui-tests-server.log" } = {}) {
  const tmp = mkdtempSync(path.join(tmpdir(), "fastmlx-ui-"));
  const models = path.join(tmp, "models");
  const empty = path.join(tmp, "empty");
  mkdirSync(models);
  mkdirSync(empty);
  for (const name of tinyModels) makeTinyModel(path.join(models, name));
  mkdirSync(path.join(root, "target"), { recursive: true });
  const logFile = path.join(root, "target", logName);
  const env = { ...process.env, FASTMLX_MODELS_DIR: models, HF_HUB_CACHE: empty, LMSTUDIO_MODELS_DIR: empty, ...extraEnv };
  // Settings saved by a test must not reach the user's config file.
  env.FASTMLX_CONFIG = path.join(tmp, "config.toml");
  delete env.FASTMLX_API_KEY;
  const proc = spawn(binary, ["serve", "--port", "0", "--max-batch", "8", ...args], { env, stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  proc.stderr.on("data", (chunk) => {
    log += chunk;
  });
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`fastmlx serve did not start: ${log}`)), 180_000);
    const onData = () => {
      const match = log.match(/FastMLX serving \S+ at (http:\/\/\S+\/v1)/);
      if (match) {
        clearTimeout(timer);
        proc.stderr.off("data", onData);
        resolve(match[1]);
      }
    };
    proc.stderr.on("data", onData);
    proc.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`fastmlx serve exited (${code}): ${log}`));
    });
  });
  return {
    url,
    base: url.replace(/\/v1$/, ""),
    modelsDir: models,
    log: () => log,
    async stop() {
      if (proc.exitCode === null) {
        const exited = new Promise((resolve) => proc.once("exit", resolve));
        proc.kill("SIGTERM");
        await Promise.race([exited, new Promise((r) => setTimeout(r, 20_000))]);
        if (proc.exitCode === null) proc.kill("SIGKILL");
      }
      writeFileSync(logFile, log);
      rmSync(tmp, { recursive: true, force: true });
    },
  };
}

export async function launchBrowser() {
  return chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--no-first-run",
    ],
  });
}

/** A fresh page (its own context: empty localStorage) that records uncaught errors and console errors. */
export async function openPage(browser, { viewport = { width: 1280, height: 820 }, colorScheme = "light" } = {}) {
  const context = await browser.newContext({ viewport, colorScheme });
  const page = await context.newPage();
  page.problems = [];
  page.on("pageerror", (e) => page.problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    // HTTP errors the UI handles (a 403 it offers to force, a Hub it cannot reach) are expected.
    if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) page.problems.push(`console error: ${m.text()}`);
  });
  return { context, page };
}

export function screenshot(page, name) {
  mkdirSync(screenshots, { recursive: true });
  return page.screenshot({ path: path.join(screenshots, `${name}.png`), fullPage: true });
}

/** Polls `fn` until it returns a truthy value (returned), or throws with `what` after `timeout`. */
export async function until(fn, what, { timeout = 30_000, interval = 100 } = {}) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what} (last: ${last instanceof Error ? last.message : JSON.stringify(last)})`);
    await new Promise((r) => setTimeout(r, interval));
  }
}

export async function api(server, pathname, init = {}) {
  const res = await fetch(server.base + pathname, {
    ...init,
    headers: { "Content-Type": "application/json", ...(init.headers ?? {}) },
    body: init.json !== undefined ? JSON.stringify(init.json) : init.body,
  });
  const text = await res.text();
  let body;
  try {
    body = JSON.parse(text);
  } catch {
    body = text;
  }
  if (!res.ok) throw new Error(`${init.method ?? "GET"} ${pathname}: ${res.status} ${text}`);
  return body;
}
