import { useCallback, useEffect, useState } from "preact/hooks";
import { ApiError, getJson, modelPath, postJson, request, type LocalModel, type ServerStatus } from "../api";
import { Badge, ErrorBox, Spinner } from "../components/common";
import { PlanCell } from "../components/PlanCell";
import { bytes, duration, params } from "../format";
import { modelPageHref } from "../links";

const sourceNames: Record<string, string> = { fastmlx: "FastMLX", "hf-cache": "HF cache", lmstudio: "LM Studio", folder: "model folder", path: "--model path" };

type Busy = "loading" | "unloading" | "deleting";

export function ModelsPage() {
  const [models, setModels] = useState<LocalModel[] | null>(null);
  const [status, setStatus] = useState<ServerStatus | null>(null);
  const [busy, setBusy] = useState<Record<string, Busy>>({});
  const [error, setError] = useState<string | null>(null);
  // A delete refused because FastMLX did not download the model: offered again with force.
  const [notOwned, setNotOwned] = useState<string | null>(null);

  const refresh = useCallback(async () => {
    try {
      const [list, st] = await Promise.all([getJson<LocalModel[]>("/admin/models"), getJson<ServerStatus>("/admin/status")]);
      setModels(list);
      setStatus(st);
    } catch (e) {
      setError((e as Error).message);
    }
  }, []);

  useEffect(() => {
    refresh();
    const timer = setInterval(refresh, 5000);
    return () => clearInterval(timer);
  }, [refresh]);

  async function act(id: string, what: Busy, run: () => Promise<unknown>) {
    setError(null);
    setBusy((b) => ({ ...b, [id]: what }));
    try {
      await run();
    } catch (e) {
      if (what === "deleting" && e instanceof ApiError && e.status === 403) {
        setNotOwned(id);
      }
      setError((e as Error).message);
    } finally {
      setBusy((b) => {
        const { [id]: _, ...rest } = b;
        return rest;
      });
      await refresh();
    }
  }

  const load = (id: string) => act(id, "loading", () => postJson("/admin/load", { model: id }));
  const unload = (id: string) => act(id, "unloading", () => postJson("/admin/unload", { model: id }));
  const remove = (id: string, force = false) => {
    const question = force
      ? `FastMLX did not download ${id}. Delete its files at the source anyway? This cannot be undone.`
      : `Delete ${id} from disk?`;
    if (!window.confirm(question)) return;
    setNotOwned(null);
    return act(id, "deleting", () => request(`/admin/models/${modelPath(id)}${force ? "?force=true" : ""}`, { method: "DELETE" }));
  };

  const loadedInfo = new Map((status?.loaded ?? []).map((m) => [m.id, m]));
  // A model loaded from a path outside the model folders (e.g. `serve --model file.gguf`) is
  // listed too, with what the status tells of it.
  const rows: LocalModel[] = [...(models ?? [])];
  for (const l of status?.loaded ?? []) {
    if (!rows.some((m) => m.id === l.id)) {
      rows.push({
        id: l.id,
        path: l.path,
        source: "path" as LocalModel["source"],
        owned: false,
        loaded: true,
        format: /\.gguf$/i.test(l.path) ? "gguf" : "hf",
        architecture: null,
        parameters: null,
        quantization: null,
        context_length: null,
        size_bytes: NaN, // unknown: the status tells the memory it takes, not the size on disk
        unloadable_reason: null,
        external: true,
      } as LocalModel & { external: boolean });
    }
  }

  return (
    <section>
      <div class="page-head">
        <h1>Models</h1>
        {status && (
          <div class="summary" data-testid="memory-summary">
            <span>
              MLX memory <b>{bytes(status.mlx_active_bytes)}</b>
            </span>
            <span title="The memory ceiling: every loaded model, its caches and working memory stay under it">
              ceiling <b>{bytes(status.memory_budget_bytes)}</b>
            </span>
            {status.machine_memory_bytes != null && (
              <span>
                machine <b>{bytes(status.machine_memory_bytes)}</b>
              </span>
            )}
          </div>
        )}
        <button class="small" onClick={refresh} data-testid="models-refresh">
          Refresh
        </button>
      </div>
      <ErrorBox error={error} onClose={() => { setError(null); setNotOwned(null); }}>
        {notOwned && (
          <button class="danger small" onClick={() => remove(notOwned, true)} data-testid="delete-anyway">
            Delete anyway
          </button>
        )}
      </ErrorBox>
      {models === null ? (
        <p class="muted">
          <Spinner /> Looking for models…
        </p>
      ) : rows.length === 0 ? (
        <p class="muted" data-testid="models-empty">
          No local models. Find one on the <a href="#/discover">Discover</a> page.
        </p>
      ) : (
        <div class="table-wrap">
          <table class="models" data-testid="models-table">
            <thead>
              <tr>
                <th>Model</th>
                <th class="num">Size</th>
                <th class="num">Params</th>
                <th>Quantization</th>
                <th>Architecture</th>
                <th title="Context each of four requests at once gets under the memory ceiling (as fastmlx inspect says)">
                  Serves here
                </th>
                <th>Source</th>
                <th class="actions"></th>
              </tr>
            </thead>
            <tbody>
              {rows.map((m) => {
                const external = "external" in m;
                const info = loadedInfo.get(m.id);
                const state = busy[m.id];
                return (
                  <tr key={m.id} data-testid="model-row" data-model={m.id} data-loaded={String(m.loaded)}>
                    <td class="model-id">
                      <div class="id" title={m.path}>
                        {external ? m.id : <a href={modelPageHref("id", m.id)} data-testid="model-link">{m.id}</a>}
                      </div>
                      <div class="badges">
                        {m.loaded && (
                          <Badge kind="ok" testid="loaded-badge">
                            loaded
                          </Badge>
                        )}
                        {m.kind && m.kind !== "chat" && (
                          <Badge kind="muted" testid="kind-badge">
                            {m.kind}
                          </Badge>
                        )}
                        {info && (
                          <span
                            class="muted small-text"
                            title={`weights ${bytes(info.weights_bytes)} + KV cache budget ${bytes(info.kv_budget_bytes)}`}
                          >
                            {bytes(info.memory_bytes)} reserved
                            {info.running + info.queued > 0 && ` · ${info.running} running, ${info.queued} queued`}
                            {info.expires_in_secs != null && ` · unloads in ${duration(info.expires_in_secs)}`}
                            {info.draft_model && ` · drafts with ${info.draft_model}`}
                            {info.mtp_head && ' · drafts with its MTP head'}
                          </span>
                        )}
                        {m.unloadable_reason && (
                          <span class="muted small-text" data-testid="unloadable-reason">
                            cannot load: {m.unloadable_reason}
                          </span>
                        )}
                      </div>
                    </td>
                    <td class="num">{bytes(m.size_bytes)}</td>
                    <td class="num">{params(m.parameters)}</td>
                    <td>{m.quantization ?? "–"}</td>
                    <td>{m.architecture ?? "–"}</td>
                    <td data-testid="serves-here">
                      <PlanCell plan={m.plan} />
                    </td>
                    <td>
                      {sourceNames[m.source] ?? m.source}
                      {m.format === "gguf" && <span class="muted"> · GGUF</span>}
                    </td>
                    <td class="actions">
                      {state ? (
                        <span class="busy" data-testid="model-busy">
                          <Spinner /> {state}…
                        </span>
                      ) : (
                        <>
                          {m.loaded ? (
                            <button class="small" onClick={() => unload(m.id)} data-testid="unload">
                              Unload
                            </button>
                          ) : (
                            !m.unloadable_reason && (
                              <button class="small primary" onClick={() => load(m.id)} data-testid="load">
                                Load
                              </button>
                            )
                          )}
                          {!external && (
                            <button class="small danger-outline" onClick={() => remove(m.id)} data-testid="delete">
                              Delete
                            </button>
                          )}
                        </>
                      )}
                    </td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}
