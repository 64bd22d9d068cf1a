import { useEffect, useState } from "preact/hooks";
import { getJson, type SearchHit } from "../api";
import { Badge, ErrorBox, Spinner } from "../components/common";
import { fitKind, PlanContext } from "../components/PlanCell";
import { bytes, count, duration, params, percent } from "../format";
import { attachRunning, cancelPull, startPull, usePulls, type PullView } from "../pulls";

let lastQuery = "";
let lastHits: SearchHit[] | null = null;

export function DiscoverPage() {
  const [query, setQuery] = useState(lastQuery);
  const [hits, setHits] = useState<SearchHit[] | null>(lastHits);
  const [searching, setSearching] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const pulls = usePulls();

  useEffect(() => {
    attachRunning().catch((e) => setError(e.message));
  }, []);

  async function search(e?: Event) {
    e?.preventDefault();
    const q = query.trim();
    if (!q) return;
    setSearching(true);
    setError(null);
    try {
      const found = await getJson<SearchHit[]>(`/admin/search?q=${encodeURIComponent(q)}&limit=20`);
      lastQuery = q;
      lastHits = found;
      setHits(found);
    } catch (err) {
      setError((err as Error).message);
    } finally {
      setSearching(false);
    }
  }

  // Pulls not among the hits (running from before, or from another search) are listed first.
  const shown = new Set((hits ?? []).map((h) => h.id));
  const others = [...pulls.values()].filter((p) => !shown.has(p.repo));

  return (
    <section>
      <div class="page-head">
        <h1>Discover</h1>
      </div>
      <form class="search" onSubmit={search}>
        <input
          type="search"
          placeholder="Search MLX models on Hugging Face, e.g. qwen 0.5b"
          value={query}
          onInput={(e) => setQuery((e.target as HTMLInputElement).value)}
          data-testid="search-input"
          autofocus
        />
        <button class="primary" type="submit" disabled={searching} data-testid="search-button">
          {searching ? <Spinner /> : "Search"}
        </button>
      </form>
      <ErrorBox error={error} onClose={() => setError(null)} />
      {others.length > 0 && (
        <div class="pull-list" data-testid="other-pulls">
          <h2>Downloads</h2>
          {others.map((p) => (
            <div class="hit" key={p.repo} data-testid="pull-row" data-repo={p.repo}>
              <div class="hit-main">
                <div class="id">{p.repo}</div>
              </div>
              <PullControls repo={p.repo} pull={p} />
            </div>
          ))}
        </div>
      )}
      {hits && hits.length === 0 && <p class="muted">No models found.</p>}
      {hits && hits.length > 0 && (
        <div class="hits" data-testid="search-results">
          {hits.map((h) => (
            <div class="hit" key={h.id} data-testid="search-hit" data-repo={h.id}>
              <div class="hit-main">
                <div class="id">
                  {h.id}
                  {h.fit && (
                    <Badge kind={fitKind[h.fit] ?? "muted"} testid="fit-badge">
                      {h.fit}
                    </Badge>
                  )}
                  {h.quantization && (
                    <Badge kind="muted" testid="quant-badge">
                      {h.quantization}
                    </Badge>
                  )}
                  {h.gated ? <Badge kind="muted">gated</Badge> : null}
                </div>
                {(h.plan || h.model_type || h.unsupported) && (
                  <div class="hit-meta">
                    {h.model_type && <span data-testid="model-type">{h.model_type}</span>}
                    {h.plan && <PlanContext plan={h.plan} />}
                    {h.unsupported && (
                      <span class="warn-text" data-testid="unsupported">
                        {h.unsupported}
                      </span>
                    )}
                  </div>
                )}
                <div class="hit-meta muted">
                  <span title="downloads">↓ {count(h.downloads)}</span>
                  <span title="likes">♥ {count(h.likes)}</span>
                  {h.storage_bytes != null && <span>{bytes(h.storage_bytes)}</span>}
                  {h.parameters != null && <span>{params(h.parameters)} stored params</span>}
                  {h.memory_needed_bytes != null && <span>needs ~{bytes(h.memory_needed_bytes)}</span>}
                  {h.last_modified && <span>updated {h.last_modified.slice(0, 10)}</span>}
                </div>
              </div>
              <PullControls repo={h.id} pull={pulls.get(h.id)} gguf={isGguf(h)} />
            </div>
          ))}
        </div>
      )}
    </section>
  );
}

/** A repo of GGUF files: one of them is chosen by name or quantization (e.g. Q4_K_M). */
function isGguf(h: SearchHit): boolean {
  return h.library === "gguf" || h.tags.includes("gguf");
}

/** Which GGUF file of the repo to fetch, by name or quantization. */
function GgufPattern({ value, onInput }: { value: string; onInput: (value: string) => void }) {
  return (
    <input
      class="gguf"
      placeholder="file or quant, e.g. Q4_K_M"
      value={value}
      onInput={(e) => onInput((e.target as HTMLInputElement).value)}
      data-testid="gguf-pattern"
    />
  );
}

function PullControls({ repo, pull, gguf = false }: { repo: string; pull: PullView | undefined; gguf?: boolean }) {
  const [error, setError] = useState<string | null>(null);
  const [pattern, setPattern] = useState("");
  const start = () => startPull(repo, gguf && pattern.trim() ? pattern.trim() : undefined);
  if (!pull) {
    return (
      <div class="pull">
        {gguf && <GgufPattern value={pattern} onInput={setPattern} />}
        <button class="small primary" onClick={start} data-testid="download">
          Download
        </button>
      </div>
    );
  }
  const p = pull.progress;
  const pct = p ? percent(p.done, p.total) : 0;
  const cancel = async () => {
    setError(null);
    try {
      await cancelPull(repo);
    } catch (e) {
      setError((e as Error).message);
    }
  };
  return (
    <div class="pull" data-testid="pull" data-state={pull.state}>
      {pull.state === "running" && (
        <>
          <div class="progress" data-testid="progress">
            <div class="bar" style={{ width: `${pct}%` }} />
          </div>
          <div class="pull-meta muted small-text" data-testid="progress-text">
            {pct.toFixed(0)}%{p && p.total > 0 && ` of ${bytes(p.total)}`}
            {p && p.bytes_per_sec > 0 && ` · ${(p.bytes_per_sec / 1e6).toFixed(1)} MB/s`}
            {p?.eta_secs != null && ` · ${duration(p.eta_secs)} left`}
            {p?.file && ` · ${p.file}`}
            {p && p.files_total > 0 && ` (${p.files_done}/${p.files_total})`}
          </div>
          <button class="small" onClick={cancel} data-testid="cancel">
            Cancel
          </button>
        </>
      )}
      {pull.state === "done" && (
        <span data-testid="pull-done">
          <Badge kind="ok">downloaded</Badge> <a href="#/models">Open in Models</a>
        </span>
      )}
      {(pull.state === "cancelled" || pull.state === "failed") && (
        <>
          <span class={pull.state === "failed" ? "error-text" : "muted"} data-testid="pull-message">
            {pull.state === "failed" ? pull.message ?? "failed" : "cancelled"}
            {p && p.total > 0 && ` at ${percent(p.done, p.total).toFixed(0)}%`}
          </span>
          {gguf && <GgufPattern value={pattern} onInput={setPattern} />}
          <button class="small primary" onClick={start} data-testid="resume">
            Resume
          </button>
        </>
      )}
      {error && <span class="error-text">{error}</span>}
    </div>
  );
}
