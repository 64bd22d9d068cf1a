import { useEffect, useState } from "preact/hooks";
import { getJson, type LocalModel } from "../api";
import { clusterLaunch, startCluster, stopCluster, type ClusterChild, type ClusterPlan } from "../native";
import { ErrorBox, Spinner } from "./common";

const SAVED = "fastmlx.cluster-plan";

interface Form {
  machines: string;
  rank: string;
  model: string;
  parallel: "pipeline" | "tensor";
}

function savedForm(): Form {
  try {
    const saved = JSON.parse(localStorage.getItem(SAVED) ?? "null");
    if (saved && typeof saved.machines === "string") {
      // Saved by a build whose list was split by commas too: a single line with commas was
      // several machines then (one machine alone is no cluster), a machine per line now.
      if (!saved.machines.includes("\n") && saved.machines.includes(",")) {
        saved.machines = saved.machines
          .split(",")
          .map((m: string) => m.trim())
          .join("\n");
      }
      return saved as Form;
    }
  } catch {
    /* a stale or foreign value: start empty */
  }
  return { machines: "", rank: "0", model: "", parallel: "pipeline" };
}

/** The plan the app runs: a machine per line, in rank order (the same list on every Mac), each its
 * `host:port` addresses (several, split by spaces or commas, for MLX's ring to use several links). */
function planOf(form: Form): ClusterPlan {
  const machines = form.machines
    .split("\n")
    .map((m) => m.trim())
    .filter((m) => m);
  return { machines, rank: Number(form.rank), model: form.model, parallel: form.parallel };
}

/** Starting this Mac's part of a cluster from the app (`fastmlx serve --cluster`, run by the app as
 * a child process): rank 0 serves the API on this address in the app's place, another rank holds
 * its layers for rank 0. Shown in the desktop app only; `onRunning` tells the page to follow the
 * cluster's status while it runs. */
export function ClusterLaunch({ onRunning }: { onRunning: (running: boolean) => void }) {
  const [form, setForm] = useState<Form>(savedForm);
  const [child, setChild] = useState<ClusterChild | null>(null);
  const [models, setModels] = useState<LocalModel[]>([]);
  const [busy, setBusy] = useState<"starting" | "stopping" | null>(null);
  const [error, setError] = useState<string | null>(null);

  useEffect(() => {
    getJson<LocalModel[]>("/admin/models")
      .then((list) => setModels(list.filter((m) => m.kind === "chat" && !m.unloadable_reason)))
      .catch(() => {});
    clusterLaunch().then(setChild).catch(() => {});
  }, []);

  const running = Boolean(child?.running);
  useEffect(() => onRunning(running), [running]);
  useEffect(() => {
    if (!running) return;
    const timer = setInterval(() => clusterLaunch().then(setChild).catch(() => {}), 2000);
    return () => clearInterval(timer);
  }, [running]);

  const plan = planOf(form);
  const set = (name: keyof Form) => (e: Event) => setForm((f) => ({ ...f, [name]: (e.target as HTMLInputElement).value }));

  async function start(e: Event) {
    e.preventDefault();
    if (plan.machines.length < 2) return setError("list at least two machines, one per line (host:port)");
    if (!plan.model) return setError("choose the model the cluster serves");
    localStorage.setItem(SAVED, JSON.stringify(form));
    setBusy("starting");
    setError(null);
    try {
      setChild(await startCluster(plan));
    } catch (err) {
      setError(String((err as Error)?.message ?? err));
    } finally {
      setBusy(null);
    }
  }

  async function stop() {
    setBusy("stopping");
    try {
      setChild(await stopCluster());
    } catch (err) {
      setError(String((err as Error)?.message ?? err));
    } finally {
      setBusy(null);
    }
  }

  return (
    <form class="card" onSubmit={start} data-testid="cluster-launch" data-running={String(running)}>
      <h2>Serve across several Macs</h2>
      <p class="muted">
        Every Mac runs FastMLX with the same list of machines and the same model; rank 0 serves the API here, the
        others hold their layers for it. The machines must reach each other (a Thunderbolt bridge or the same network).
      </p>
      <ErrorBox error={error} onClose={() => setError(null)} />
      <label for="cluster-machines">
        Machines, in rank order: one per line, host:port (several addresses of one Mac on its line, e.g. two
        Thunderbolt bridges, for more bandwidth)
      </label>
      <textarea
        id="cluster-machines"
        rows={3}
        placeholder={"10.0.0.1:32323\n10.0.0.2:32323"}
        value={form.machines}
        onInput={set("machines")}
        disabled={running}
        data-testid="cluster-machines"
      />
      <div class="row">
        <label for="cluster-rank">This Mac</label>
        <select id="cluster-rank" value={form.rank} onChange={set("rank")} disabled={running} data-testid="cluster-rank">
          {(plan.machines.length ? plan.machines : ["rank 0"]).map((m, i) => (
            <option key={i} value={String(i)}>
              rank {i}
              {plan.machines.length ? ` (${m})` : ""}
            </option>
          ))}
        </select>
        <label for="cluster-parallel">Split</label>
        <select id="cluster-parallel" value={form.parallel} onChange={set("parallel")} disabled={running} data-testid="cluster-parallel">
          <option value="pipeline">by layers (any link)</option>
          <option value="tensor">by tensors (fast links)</option>
        </select>
      </div>
      <label for="cluster-model">Model (the same on every Mac)</label>
      <select id="cluster-model" value={form.model} onChange={set("model")} disabled={running} data-testid="cluster-model">
        <option value="">Choose…</option>
        {models.map((m) => (
          <option key={m.id} value={m.id}>
            {m.id}
          </option>
        ))}
      </select>
      <div class="row">
        {running ? (
          <button type="button" onClick={stop} disabled={busy != null} data-testid="cluster-stop">
            {busy === "stopping" ? <Spinner /> : "Stop"}
          </button>
        ) : (
          <button type="submit" class="primary" disabled={busy != null} data-testid="cluster-start">
            {busy === "starting" ? <Spinner /> : "Start"}
          </button>
        )}
        {child && (
          <span class={child.running ? "muted" : "warn-note"} data-testid="cluster-child">
            {child.running
              ? `rank ${child.rank} of ${child.machines.length} running (process ${child.pid})${
                  child.rank === 0 ? ": it serves the API here" : ""
                }`
              : `rank ${child.rank} ended: ${child.exit}`}
          </span>
        )}
      </div>
      {child && child.log.length > 0 && (
        <pre class="cluster-log" data-testid="cluster-log">
          {child.log.slice(-12).join("\n")}
        </pre>
      )}
      <p class="muted">Starting unloads this Mac's models: the cluster needs the memory.</p>
    </form>
  );
}
