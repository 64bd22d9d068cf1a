// The app's first run, in its real window: no model anywhere, so the menu bar's first item is
// "No model yet – Choose one…", which opens the dashboard on Discover's recommendations; a model
// that lands in the models folder shows in the menu within its refresh. (No tray host draws the
// menu under Xvfb: the app's test build reads its rows and runs an item's action as a click does.)
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import path from "node:path";
import { binary, exec, find, go, launch, quit, screenshot, tmp, until } from "./harness.mjs";

const CHOOSE = "No model yet – Choose one…";

/** A command of the app's test build: `test_tray_menu` (the menu's rows, {id, label, enabled}) or
 * `test_tray_click` (an item's action, as a click runs it). */
async function tray(command, args) {
  // WebDriver awaits the promise the script returns.
  return exec(`return await window.__TAURI__.core.invoke(arguments[0], arguments[1]);`, [command, args ?? {}]);
}

// No model, not even the default one the setup script installed.
before(() => launch({ name: "first-run", args: ["--no-model"], env: { FASTMLX_MODEL: undefined } }));

after(quit);

test("first run: the menu offers to choose a model and opens the recommendations", async () => {
  // With nothing on disk the dashboard opens on Discover, not on an empty table.
  await until(async () => (await exec(`return location.hash;`)) === "#/discover", "Discover at first");
  const rows = await until(async () => {
    const r = await tray("test_tray_menu");
    return r.some((row) => row.id === "choose-model") && r;
  }, "the first-run item");
  const choose = rows.find((row) => row.id === "choose-model");
  assert.deepEqual(choose, { id: "choose-model", label: CHOOSE, enabled: true });

  // Elsewhere in the dashboard, the item brings it back to the recommendations.
  await go("#/models");
  await find("[data-testid=page-models]");
  await tray("test_tray_click", { id: "choose-model" });
  await until(async () => (await exec(`return location.hash;`)) === "#/discover", "Discover again");
  await find("[data-testid=rec-model]");
  const fits = await exec(`return [...document.querySelectorAll("[data-testid=rec-model]")].map((e) => e.dataset.fit);`);
  assert.ok(fits.length >= 10 && fits.includes("fits"), `the shipped list, with what fits here: ${fits}`);
  await screenshot("first-run-discover");

  // A model arriving (as a download would leave it) replaces the item in the menu.
  execFileSync(binary, ["make-test-model", "--arch", "llama", path.join(tmp, "models", "tiny-llama")], { stdio: "ignore" });
  await until(async () => {
    const r = await tray("test_tray_menu");
    return r.some((row) => row.id === "serve:tiny-llama" || row.label.includes("tiny-llama")) && !r.some((row) => row.id === "choose-model");
  }, "the new model in the menu, the first-run item gone", 30_000);
});
