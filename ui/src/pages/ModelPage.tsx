// A model's page, from Models (`#/model?id=...`, on disk) or Discover (`#/model?repo=...`, on
// the Hub): its card, what its config says, what it takes and serves here, its files, and the
// clients' configurations with its id filled in.
import { useEffect, useState } from "preact/hooks";
import { getJson, serverOrigin, type ServingPlan, type Settings } from "../api";
import { Badge, ErrorBox, Spinner } from "../components/common";
import { Markdown } from "../components/Markdown";
import { fitKind } from "../components/PlanCell";
import { bytes, params } from "../format";
import { clientSnippets } from "../snippets";
import { SnippetCards } from "../components/SnippetCards";

interface ConfigSummary {
  model_type: string;
  parameters: number;
  layers: number;
  recurrent_layers: number;
  windowed_layers: number;
  window: number | null;
  hidden_size: number;
  heads: number;
  kv_heads: number;
  head_dim: number;
  context: number;
  experts: number | null;
  experts_per_token: number | null;
  vision: boolean;
}

interface ModelInfo {
  id: string;
  source: "disk" | "hub";
  readme: string | null;
  config: ConfigSummary | null;
  unsupported: string | null;
  files: { name: string; bytes: number | null }[];
  plan: ServingPlan | null;
  kv_per_1k_tokens: { full: number; kv8: number | null; kv4: number | null } | null;
}

/** The page's subject from the address: `id` (on disk) or `repo` (Hub). */
function subject(): { key: "id" | "repo"; value: string } | null {
  const query = new URLSearchParams(window.location.hash.split("?")[1] ?? "");
  const id = query.get("id");
  if (id) return { key: "id", value: id };
  const repo = query.get("repo");
  return repo ? { key: "repo", value: repo } : null;
}

const k = (n: number) => (n >= 1000 ? `${Math.round(n / 100) / 10}k` : String(n));

export function ModelPage() {
  const [info, setInfo] = useState<ModelInfo | null>(null);
  const [settings, setSettings] = useState<Settings | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [target, setTarget] = useState(subject);

  useEffect(() => {
    const onHash = () => setTarget(subject());
    window.addEventListener("hashchange", onHash);
    return () => window.removeEventListener("hashchange", onHash);
  }, []);
  useEffect(() => {
    setInfo(null);
    setError(null);
    if (!target) {
      setError("No model named: open a model from the Models or Discover page.");
      return;
    }
    getJson<ModelInfo>(`/admin/model-info?${target.key}=${encodeURIComponent(target.value)}`)
      .then(setInfo)
      .catch((e: Error) => setError(e.message));
    getJson<Settings>("/admin/settings")
      .then(setSettings)
      .catch(() => setSettings(null));
  }, [target?.key, target?.value]);

  const c = info?.config;
  const plan = info?.plan;
  const url = `${(settings?.api_url || serverOrigin()).replace(/\/+$/, "").replace(/\/v1$/, "")}/v1`;
  const keyText = settings?.api_key_set ? "YOUR_FASTMLX_API_KEY" : "not-needed";
  const snippets = info
    ? clientSnippets({ url, keyText, modelId: info.id, embedId: info.id, context: plan?.context_tokens || c?.context || null })
    : [];
  return (
    <section data-testid="model-page">
      <div class="page-head">
        <h1 data-testid="model-page-id">{target?.value ?? "Model"}</h1>
        {info && <Badge kind="muted">{info.source === "disk" ? "on disk" : "on the Hub"}</Badge>}
        <a href={info?.source === "hub" ? "#/discover" : "#/models"}>Back</a>
      </div>
      <ErrorBox error={error} />
      {!info && !error && <Spinner label="loading the model's page" />}
      {info && (
        <div class="model-page">
          {info.unsupported && (
            <div class="note warn-note" data-testid="model-unsupported">
              FastMLX cannot load it: {info.unsupported}
            </div>
          )}
          <div class="model-facts">
            {c && (
              <div class="card">
                <h2>Shape</h2>
                <dl class="facts" data-testid="model-config">
                  <dt>Family</dt>
                  <dd>{c.model_type}</dd>
                  <dt>Parameters</dt>
                  <dd>{params(c.parameters)}</dd>
                  <dt>Layers</dt>
                  <dd>
                    {c.layers}
                    {c.recurrent_layers > 0 && ` (${c.recurrent_layers} linear attention)`}
                    {c.windowed_layers > 0 && ` (${c.windowed_layers} windowed, ${k(c.window ?? 0)} tokens)`}
                  </dd>
                  <dt>Attention</dt>
                  <dd>
                    {c.heads} heads, {c.kv_heads} for keys and values, {c.head_dim} wide
                  </dd>
                  <dt>Context</dt>
                  <dd>{k(c.context)} tokens</dd>
                  {c.experts != null && (
                    <>
                      <dt>Experts</dt>
                      <dd>
                        {c.experts_per_token} of {c.experts} per token
                      </dd>
                    </>
                  )}
                  <dt>Vision</dt>
                  <dd>{c.vision ? "a vision tower (its text model is served)" : "text only"}</dd>
                </dl>
              </div>
            )}
            {(plan || info.kv_per_1k_tokens) && (
              <div class="card">
                <h2>On this machine</h2>
                <table class="compact" data-testid="model-memory">
                  <tbody>
                    {plan && (
                      <tr>
                        <th>Weights</th>
                        <td colSpan={3}>{bytes(plan.weights_bytes)}</td>
                      </tr>
                    )}
                    <tr>
                      <th />
                      <th>full</th>
                      <th>8-bit KV</th>
                      <th>4-bit KV</th>
                    </tr>
                    {info.kv_per_1k_tokens && (
                      <tr>
                        <th>KV per 1k tokens</th>
                        <td>{bytes(info.kv_per_1k_tokens.full)}</td>
                        <td>{bytes(info.kv_per_1k_tokens.kv8)}</td>
                        <td>{bytes(info.kv_per_1k_tokens.kv4)}</td>
                      </tr>
                    )}
                    {plan && (
                      <tr data-testid="model-context">
                        <th>Context for {plan.rows} requests</th>
                        <td>{k(plan.context_tokens)}</td>
                        <td>{plan.context_tokens_kv8 != null ? k(plan.context_tokens_kv8) : "–"}</td>
                        <td>{plan.context_tokens_kv4 != null ? k(plan.context_tokens_kv4) : "–"}</td>
                      </tr>
                    )}
                  </tbody>
                </table>
                {plan && (
                  <p class="small-text">
                    <Badge kind={fitKind[plan.fit] ?? "muted"} testid="model-fit">
                      {plan.fit}
                    </Badge>{" "}
                    under the ceiling of {bytes(plan.ceiling_bytes)}
                  </p>
                )}
              </div>
            )}
            <div class="card">
              <h2>Files</h2>
              <ul class="files" data-testid="model-files">
                {info.files.map((f) => (
                  <li key={f.name}>
                    <code>{f.name}</code> <span class="muted">{f.bytes != null ? bytes(f.bytes) : ""}</span>
                  </li>
                ))}
              </ul>
            </div>
          </div>
          {info.readme ? (
            <div class="card model-card">
              <Markdown text={stripFrontMatter(info.readme)} testid="model-readme" />
            </div>
          ) : (
            <p class="muted">No model card.</p>
          )}
          <h2>Connect your tools to it</h2>
          <SnippetCards snippets={snippets} testid="model-snippet" />
        </div>
      )}
    </section>
  );
}

/** A card's YAML header (license, tags) is metadata, not text to show. */
function stripFrontMatter(text: string): string {
  return text.replace(/^---\n[\s\S]*?\n---\n/, "");
}
