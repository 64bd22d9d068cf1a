import { useEffect, useState } from "preact/hooks";
import {
  getJson,
  postJson,
  request,
  serverOrigin,
  storeApiKey,
  storedApiKey,
  type LoadedModel,
  type ServerStatus,
  type Settings,
} from "../api";
import { ClusterSection } from "../components/Cluster";
import { ClusterLaunch } from "../components/ClusterLaunch";
import { CopyButton, ErrorBox, Spinner } from "../components/common";
import { clientSnippets } from "../snippets";
import { SnippetCards } from "../components/SnippetCards";
import { getLaunchAtLogin, hasNative, setLaunchAtLogin } from "../native";

interface Form {
  max_batch: string;
  memory_budget_mb: string;
  prefix_cache_mb: string;
  keep_alive_secs: string;
  kv_bits: string;
  kv_start: string;
  model_kv: string;
}

function formOf(s: Settings): Form {
  return {
    max_batch: String(s.max_batch ?? ""),
    memory_budget_mb: s.memory_budget_mb == null ? "" : String(s.memory_budget_mb),
    prefix_cache_mb: String(s.prefix_cache_mb ?? ""),
    keep_alive_secs: s.keep_alive_secs == null ? "" : String(s.keep_alive_secs),
    kv_bits: String(s.kv_bits ?? 0),
    kv_start: String(s.kv_start ?? 0),
    model_kv: (s.model_kv ?? []).join(", "),
  };
}

/** The OpenAI base URL, ending in /v1. */
function v1Url(settings: Settings | null): string {
  const base = (settings?.api_url || serverOrigin()).replace(/\/+$/, "").replace(/\/v1$/, "");
  return `${base}/v1`;
}

export function ServerPage() {
  const [settings, setSettings] = useState<Settings | null>(null);
  const [form, setForm] = useState<Form | null>(null);
  const [model, setModel] = useState<string>("");
  const [embedModel, setEmbedModel] = useState<string>("");
  const [context, setContext] = useState<number | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [saving, setSaving] = useState(false);
  const [saved, setSaved] = useState(false);
  const [key, setKey] = useState(storedApiKey());
  const [keySaved, setKeySaved] = useState(false);
  const [launch, setLaunch] = useState<boolean | null>(null);
  const [cleared, setCleared] = useState<string | null>(null);
  const [clustered, setClustered] = useState<LoadedModel[]>([]);
  const [waiting, setWaiting] = useState<ServerStatus["waiting"]>(null);
  // This Mac's rank of a cluster, started here (the app only).
  const [launched, setLaunched] = useState(false);

  async function clearCache() {
    setCleared(null);
    try {
      const res = await request("/admin/cache", { method: "DELETE" });
      const body = (await res.json()) as { cleared: string[] };
      setCleared(body.cleared.length ? `Cleared for ${body.cleared.join(", ")}.` : "No model loaded.");
    } catch (err) {
      setError((err as Error).message);
    }
  }

  useEffect(() => {
    getJson<Settings>("/admin/settings")
      .then((s) => {
        setSettings(s);
        setForm(formOf(s));
      })
      .catch((e) => setError(e.message));
    getJson<ServerStatus>("/admin/status")
      .then((st) => {
        const chat = st.loaded.filter((m) => (m.kind ?? "chat") === "chat");
        setModel(chat[0]?.id ?? "");
        setEmbedModel(st.loaded.find((m) => m.kind === "embedding")?.id ?? "");
        // The window it serves, which agents must be told (Claude Code assumes 1M for a model it does not know).
        setContext(chat[0]?.context_length ?? null);
        setClustered(st.loaded.filter((m) => m.cluster));
        setWaiting(st.waiting ?? null);
      })
      .catch(() => {});
    if (hasNative()) getLaunchAtLogin().then(setLaunch).catch(() => setLaunch(null));
  }, []);

  // A model split across machines: its step costs and a lost machine, kept current.
  const hasCluster = clustered.length > 0 || waiting != null || launched;
  useEffect(() => {
    if (!hasCluster) return;
    const timer = setInterval(() => {
      getJson<ServerStatus>("/admin/status")
        .then((st) => {
          setClustered(st.loaded.filter((m) => m.cluster));
          setWaiting(st.waiting ?? null);
        })
        .catch(() => {});
    }, 2000);
    return () => clearInterval(timer);
  }, [hasCluster]);

  async function save(e: Event) {
    e.preventDefault();
    if (!form || !settings) return;
    const changes: Record<string, number | null | string[]> = {};
    const int = (v: string) => (v.trim() === "" ? null : Number(v));
    const wanted = {
      max_batch: int(form.max_batch),
      memory_budget_mb: int(form.memory_budget_mb),
      prefix_cache_mb: int(form.prefix_cache_mb),
      keep_alive_secs: int(form.keep_alive_secs),
      kv_bits: int(form.kv_bits),
      kv_start: int(form.kv_start),
    };
    for (const [name, value] of Object.entries(wanted)) {
      if (value !== null && (!Number.isInteger(value) || value < 0)) {
        setError(`${name.replace(/_/g, " ")} must be a whole number`);
        return;
      }
      if (value !== settings[name as keyof typeof wanted]) changes[name] = value;
    }
    const modelKv = form.model_kv
      .split(",")
      .map((m) => m.trim())
      .filter((m) => m);
    if (modelKv.join(",") !== (settings.model_kv ?? []).join(",")) changes.model_kv = modelKv;
    if (wanted.max_batch === null) {
      setError("max batch must be a whole number");
      return;
    }
    setSaving(true);
    setSaved(false);
    setError(null);
    try {
      const applied = await postJson<Settings>("/admin/settings", changes);
      setSettings(applied);
      setForm(formOf(applied));
      setSaved(true);
    } catch (err) {
      setError((err as Error).message);
    } finally {
      setSaving(false);
    }
  }

  const url = v1Url(settings);
  const keyText = settings?.api_key_set ? "YOUR_FASTMLX_API_KEY" : "not-needed";
  const modelId = model || "MODEL_ID";
  const embedId = embedModel || "EMBEDDING_MODEL_ID";
  const field = (name: keyof Form) => ({
    value: form?.[name] ?? "",
    onInput: (e: Event) => {
      setSaved(false);
      setForm((f) => (f ? { ...f, [name]: (e.target as HTMLInputElement).value } : f));
    },
  });

  const snippets = clientSnippets({ url, keyText, modelId, embedId, context });

  return (
    <section>
      <div class="page-head">
        <h1>Server</h1>
      </div>
      <ErrorBox error={error} onClose={() => setError(null)} />
      <ErrorBox error={waiting ? `${waiting.id}: ${waiting.reason}` : null} />
      {clustered.map((m) => m.cluster && <ClusterSection key={m.id} model={m.id} cluster={m.cluster} fault={m.fault} />)}
      {hasNative() && <ClusterLaunch onRunning={setLaunched} />}
      {!settings ? (
        !error && (
          <p class="muted">
            <Spinner /> Reading settings…
          </p>
        )
      ) : (
        <div class="server-grid">
          <div class="card">
            <h2>Address</h2>
            <dl class="facts">
              <dt>API URL</dt>
              <dd>
                <code data-testid="api-url">{url}</code> <CopyButton text={url} testid="copy-url" />
              </dd>
              <dt>Bind address</dt>
              <dd data-testid="bind-host">{settings.host ?? "–"}</dd>
              <dt>Port</dt>
              <dd data-testid="bind-port">{settings.port ?? "–"}</dd>
              <dt>API key</dt>
              <dd data-testid="api-key-set">{settings.api_key_set ? "required" : "not set (no key needed)"}</dd>
              <dt>Models folder</dt>
              <dd>
                <code data-testid="models-dir">{settings.models_dir}</code>
              </dd>
            </dl>
            <form
              class="key-form"
              onSubmit={(e) => {
                e.preventDefault();
                storeApiKey(key.trim());
                setKeySaved(true);
              }}
            >
              <label for="api-key">API key for this browser</label>
              <div class="row">
                <input
                  id="api-key"
                  type="password"
                  autocomplete="off"
                  placeholder={settings.api_key_set ? "the server's key" : "optional"}
                  value={key}
                  onInput={(e) => {
                    setKey((e.target as HTMLInputElement).value);
                    setKeySaved(false);
                  }}
                  data-testid="api-key-input"
                />
                <button type="submit" class="small" data-testid="api-key-save">
                  Store
                </button>
              </div>
              {keySaved && <span class="muted small-text">{key.trim() ? "Stored in this browser." : "Removed."}</span>}
            </form>
          </div>
          <form class="card" onSubmit={save} data-testid="settings-form">
            <h2>Engine</h2>
            <label for="max-batch">Max batch (concurrent requests per model)</label>
            <input id="max-batch" type="number" min="1" step="1" {...field("max_batch")} data-testid="max-batch" />
            <label for="memory-budget">
              Memory limit (MB; the ceiling for every loaded model, its caches and working memory; empty: the
              default, 70 % of the machine and on a Mac at most the GPU's working set)
            </label>
            <input id="memory-budget" type="number" min="0" step="1" {...field("memory_budget_mb")} data-testid="memory-budget" />
            <label for="prefix-cache">Prefix cache (MB per model; 0: off; models loaded from now on)</label>
            <input id="prefix-cache" type="number" min="0" step="1" {...field("prefix_cache_mb")} data-testid="prefix-cache-mb" />
            <label for="kv-bits">
              KV cache quantization (models loaded from now on): 8 bits take about half the memory of 16-bit keys and
              values with answers barely changed, 4 bits a quarter
            </label>
            <select id="kv-bits" {...field("kv_bits")} data-testid="kv-bits">
              <option value="0">off (full precision)</option>
              <option value="8">8 bits</option>
              <option value="4">4 bits</option>
            </select>
            <label for="kv-start">Quantize from (tokens; shorter conversations stay at full precision)</label>
            <input id="kv-start" type="number" min="0" step="1" {...field("kv_start")} data-testid="kv-start" />
            <label for="model-kv">
              Per model (MODEL=BITS[/GROUP[/START]], comma-separated; BITS 8, 4 or off): e.g. a large coder at 4 bits
              while a small model stays exact
            </label>
            <input id="model-kv" type="text" placeholder="qwen3-coder-30b=4, smollm2=off" {...field("model_kv")} data-testid="model-kv" />
            <label for="keep-alive">Keep-alive (seconds idle before a model unloads; empty: never)</label>
            <input id="keep-alive" type="number" min="0" step="1" placeholder="never" {...field("keep_alive_secs")} data-testid="keep-alive" />
            <div class="row">
              <button type="submit" class="primary" disabled={saving} data-testid="settings-save">
                {saving ? <Spinner /> : "Save"}
              </button>
              {saved && (
                <span class="ok-text" data-testid="settings-saved">
                  Applied: max batch {settings.max_batch}, memory limit{" "}
                  {settings.memory_budget_mb == null ? "default" : `${settings.memory_budget_mb} MB`}, keep-alive{" "}
                  {settings.keep_alive_secs == null ? "never" : `${settings.keep_alive_secs} s`}, prefix cache{" "}
                  {settings.prefix_cache_mb ? `${settings.prefix_cache_mb} MB` : "off"}, KV cache{" "}
                  {settings.kv_bits ? `${settings.kv_bits}-bit from ${settings.kv_start} tokens` : "full precision"}
                </span>
              )}
            </div>
            <div class="row">
              <button type="button" class="small" onClick={clearCache} data-testid="clear-prefix-cache">
                Clear prefix cache
              </button>
              <span class="muted small-text">Prompts seen before (RAM and disk) are forgotten; the next turn of each conversation prefills again.</span>
              {cleared && (
                <span class="ok-text" data-testid="prefix-cache-cleared">
                  {cleared}
                </span>
              )}
            </div>
            {launch !== null && (
              <label class="check">
                <input
                  type="checkbox"
                  checked={launch}
                  onChange={async (e) => {
                    const enabled = (e.target as HTMLInputElement).checked;
                    try {
                      await setLaunchAtLogin(enabled);
                      setLaunch(enabled);
                    } catch (err) {
                      setError((err as Error).message ?? String(err));
                    }
                  }}
                  data-testid="launch-at-login"
                />
                Launch FastMLX at login
              </label>
            )}
          </form>
        </div>
      )}
      <h2>Connect your tools</h2>
      <SnippetCards snippets={snippets} testid="snippet" copyTestid="copy" />
    </section>
  );
}
