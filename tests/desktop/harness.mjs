// The desktop tests' harness: `fastmlx app` in its Tauri window, driven through WebKitWebDriver
// under Xvfb (scripts/test.sh runs tests/desktop/ under xvfb-run), and the W3C WebDriver commands
// the tests use. Screenshots go to target/desktop-screenshots/.
// The app is a tray app: it outlives the WebDriver session, so `quit` ends every process a launch
// started (found by a marker in their environment), and none of them holds node's pipes.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { appendFileSync, closeSync, mkdtempSync, mkdirSync, openSync, readdirSync, readFileSync, readlinkSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
export const binary = process.env.FASTMLX_BIN ?? path.join(root, "target/debug/fastmlx");
const driverBinary = process.env.WEBKIT_WEBDRIVER ?? "/usr/bin/WebKitWebDriver";
const shots = path.join(root, "target/desktop-screenshots");
export const SMOL = "SmolLM2-135M-Instruct.Q4_1";

let driver, driverUrl, session, marker, appPid, driverLog;
/** The launch's scratch folder (models, config, the webview's storage). */
export let tmp;

/** Our processes whose environment holds this run's marker: the driver, the app it launched, the app's WebKit helpers. */
function markedPids() {
  const pids = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (readFileSync(`/proc/${name}/environ`, "latin1").split("\0").includes(marker)) pids.push(Number(name));
    } catch {
      // Gone meanwhile, or not ours to read.
    }
  }
  return pids;
}

function signalAll(pids, sig) {
  for (const pid of pids) {
    try {
      process.kill(pid, sig);
    } catch {
      // Already gone.
    }
  }
}

/** A process's state letter and parent pid, or null once it is gone. */
function stat(pid) {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, "latin1");
    const [state, ppid] = text.slice(text.lastIndexOf(")") + 2).split(" ");
    return { state, ppid: Number(ppid) };
  } catch {
    return null;
  }
}

// A zombie is dead already: only its parent's wait is missing.
const running = (pid) => !["Z", "X", undefined].includes(stat(pid)?.state);

/** Waits up to 5 s for `pids` to end. */
async function gone(pids) {
  const end = Date.now() + 5_000;
  while (pids.some(running) && Date.now() < end) await new Promise((r) => setTimeout(r, 100));
}

/**
 * Ends everything this file started: SIGTERM, then SIGKILL what is still there after 5 s.
 * Children before parents (the app's WebKit helpers, the app, then the driver), so that each is
 * reaped by its parent rather than left to an init that may never reap it.
 */
async function endStarted() {
  if (!marker) return;
  const termed = [];
  const killed = [];
  for (let round = 0; round < 10; round++) {
    const live = markedPids().filter(running);
    if (!live.length) break;
    const leaves = live.filter((pid) => !live.some((other) => stat(other)?.ppid === pid));
    signalAll(leaves, "SIGTERM");
    termed.push(...leaves);
    await gone(leaves);
    const stubborn = leaves.filter(running);
    signalAll(stubborn, "SIGKILL");
    killed.push(...stubborn);
    await gone(stubborn);
  }
  appendFileSync(driverLog, `\ntest teardown: SIGTERM to ${termed.join(" ") || "none"} (the app: ${appPid ?? "not seen"}); SIGKILL to ${killed.join(" ") || "none"}\n`);
}

// The runner ends this file with SIGTERM when it passes its --test-timeout, and `after` does not run then.
for (const sig of ["SIGTERM", "SIGINT"]) {
  process.once(sig, async () => {
    await endStarted();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
    process.exit(1);
  });
}

export function freePort() {
  return new Promise((resolve) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** One W3C WebDriver command; throws with the driver's message on an error. */
export async function wd(method, route, body) {
  const res = await fetch(`${driverUrl}/session/${session}${route}`, {
    method,
    headers: { "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const json = await res.json();
  if (!res.ok) throw new Error(`${method} ${route}: ${json.value?.error}: ${json.value?.message}`);
  return json.value;
}

export const exec = (script, args = []) => wd("POST", "/execute/sync", { script, args });
const ELEMENT = "element-6066-11e4-a52e-4f735466cecf";

export async function until(check, what, timeout = 60_000) {
  const end = Date.now() + timeout;
  for (;;) {
    let value, error;
    try {
      value = await check();
    } catch (e) {
      error = e;
    }
    if (value) return value;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}${error ? `: ${error.message}` : ""}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** The element for a CSS selector, once it exists. */
export const find = (css, timeout) => until(async () => (await wd("POST", "/element", { using: "css selector", value: css }))[ELEMENT], css, timeout);
export const click = async (css) => wd("POST", `/element/${await find(css)}/click`, {});
export const attr = async (css, name) => exec(`const e = document.querySelector(arguments[0]); return e && e.getAttribute(arguments[1]);`, [css, name]);

export async function screenshot(name) {
  mkdirSync(shots, { recursive: true });
  writeFileSync(path.join(shots, `${name}.png`), Buffer.from(await wd("GET", "/screenshot"), "base64"));
}

export async function go(hash) {
  await exec(`location.hash = arguments[0];`, [hash]);
}

/** The API of the app's own server, as its page knows it. */
export async function api(route, init = {}) {
  const base = await exec(`return window.__FASTMLX__.apiBase;`);
  const res = await fetch(base + route, { ...init, headers: { "content-type": "application/json" } });
  assert.ok(res.ok, `${route}: ${res.status}`);
  return res.json();
}

/**
 * Starts `fastmlx app` in its window through WebKitWebDriver (the driver's and the app's output in
 * target/desktop-webdriver-NAME.log). `args` go after `fastmlx app`; `prepare(models)` fills the
 * models folder first; `env` adds to (or, with undefined values, removes from) the app's environment.
 */
export async function launch({ name = "app", args = [], prepare = () => {}, env: extra = {} } = {}) {
  driverLog = path.join(root, `target/desktop-webdriver-${name}.log`);
  tmp = mkdtempSync(path.join(tmpdir(), "fastmlx-desktop-"));
  marker = `FASTMLX_DESKTOP_TEST=${path.basename(tmp)}`;
  const models = path.join(tmp, "models");
  const empty = path.join(tmp, "empty");
  mkdirSync(empty);
  mkdirSync(models, { recursive: true });
  prepare(models);
  const port = await freePort();
  driverUrl = `http://127.0.0.1:${port}`;
  // The app inherits the driver's environment, marker included.
  const env = {
    ...process.env,
    FASTMLX_DESKTOP_TEST: path.basename(tmp),
    TAURI_WEBVIEW_AUTOMATION: "true",
    FASTMLX_MODELS_DIR: models,
    HF_HUB_CACHE: empty,
    LMSTUDIO_MODELS_DIR: empty,
    FASTMLX_CONFIG: path.join(tmp, "config.toml"),
    // The webview's storage (saved conversations) starts empty and stays out of the user's.
    XDG_DATA_HOME: path.join(tmp, "data"),
  };
  delete env.FASTMLX_API_KEY;
  for (const [name, value] of Object.entries(extra)) {
    if (value === undefined) delete env[name];
    else env[name] = value;
  }
  // Output to a file, not a pipe: the app inherits it, and a pipe it holds open would keep
  // `node --test` waiting for this file's output long after the tests ended.
  mkdirSync(path.dirname(driverLog), { recursive: true });
  const log = openSync(driverLog, "w");
  driver = spawn(driverBinary, [`--port=${port}`], { env, stdio: ["ignore", log, log] });
  closeSync(log);
  await until(async () => (await fetch(`${driverUrl}/status`)).ok, "WebKitWebDriver", 20_000);
  const res = await fetch(`${driverUrl}/session`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ capabilities: { alwaysMatch: { "webkitgtk:browserOptions": { binary, args: ["app", "--port", "0", ...args] } } } }),
  });
  const json = await res.json();
  assert.ok(res.ok, `no session: ${JSON.stringify(json)} ${readFileSync(driverLog, "utf8")}`);
  session = json.value.sessionId;
  // The app's own pid, for the teardown (the driver starts it and does not end it).
  const exe = realpathSync(binary);
  const exeOf = (pid) => {
    try {
      // " (deleted)": the binary was rebuilt since the app started.
      return readlinkSync(`/proc/${pid}/exe`).replace(/ \(deleted\)$/, "");
    } catch {
      return null;
    }
  };
  appPid = await until(() => markedPids().find((pid) => pid !== driver.pid && exeOf(pid) === exe), "the app's process", 20_000);
}

/** Ends the session, the app, the driver and their helpers, and removes the scratch folder. */
export async function quit() {
  if (session) await fetch(`${driverUrl}/session/${session}`, { method: "DELETE", signal: AbortSignal.timeout(15_000) }).catch(() => {});
  // Closing the session closes the window, not the tray app: end it, the driver and their helpers.
  await endStarted();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
}
