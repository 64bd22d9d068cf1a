import { useEffect, useState } from "preact/hooks";
import { getJson, type SearchHit } from "../api";
import { Badge, ErrorBox, Spinner } from "../components/common";
import { fitKind, PlanContext } from "../components/PlanCell";
import { PullControls } from "../components/PullControls";
import { RecommendedList, useRecommendations } from "../components/Recommended";
import { bytes, count, params } from "../format";
import { attachRunning, usePulls } from "../pulls";
import { modelPageHref } from "../links";

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

  const recommended = useRecommendations();
  const [filters, setFilters] = useState<Filters>(noFilters);
  const shownHits = hits?.filter((h) => passes(h, filters)) ?? null;

  function backToRecommended() {
    lastQuery = "";
    lastHits = null;
    setQuery("");
    setHits(null);
  }

  // Pulls not shown below (running from before, or from another search) are listed first.
  const shown = new Set(
    hits
      ? hits.map((h) => h.id)
      : (recommended.list?.uses ?? []).flatMap((u) => u.models.flatMap((m) => m.quantizations.map((q) => q.repo))),
  );
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
        {hits && (
          <button type="button" onClick={backToRecommended} data-testid="back-to-recommended">
            Recommended
          </button>
        )}
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
      {!hits && <RecommendedList state={recommended} pulls={pulls} />}
      {hits && hits.length === 0 && <p class="muted">No models found.</p>}
      {hits && hits.length > 0 && <FilterBar hits={hits} filters={filters} onChange={setFilters} />}
      {shownHits && hits && hits.length > 0 && shownHits.length === 0 && (
        <p class="muted">No result passes these filters.</p>
      )}
      {shownHits && shownHits.length > 0 && (
        <div class="hits" data-testid="search-results">
          {shownHits.map((h) => (
            <div class="hit" key={h.id} data-testid="search-hit" data-repo={h.id}>
              <div class="hit-main">
                <div class="id">
                  <a href={modelPageHref("repo", h.id)} data-testid="hit-link">
                    {h.id}
                  </a>
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


interface Filters {
  family: string;
  quantization: string;
  size: string;
  fitsOnly: boolean;
}

const noFilters: Filters = { family: "", quantization: "", size: "", fitsOnly: false };

/** Download sizes to choose among (what a Mac's memory is measured against). */
const sizes: Record<string, [number, number]> = {
  "under 4 GB": [0, 4e9],
  "4 to 16 GB": [4e9, 16e9],
  "16 to 48 GB": [16e9, 48e9],
  "over 48 GB": [48e9, Infinity],
};

function passes(h: SearchHit, f: Filters): boolean {
  if (f.family && h.model_type !== f.family) return false;
  if (f.quantization && h.quantization !== f.quantization) return false;
  if (f.size) {
    const [low, high] = sizes[f.size];
    if (h.storage_bytes == null || h.storage_bytes < low || h.storage_bytes >= high) return false;
  }
  return !f.fitsOnly || (h.fit === "fits" && !h.unsupported);
}

/** Family, quantization and size among the results, and "only what fits and loads here". */
function FilterBar({ hits, filters, onChange }: { hits: SearchHit[]; filters: Filters; onChange: (f: Filters) => void }) {
  const distinct = (values: (string | null)[]) => [...new Set(values.filter((v): v is string => !!v))].sort();
  const families = distinct(hits.map((h) => h.model_type));
  const quantizations = distinct(hits.map((h) => h.quantization));
  const select = (key: "family" | "quantization" | "size", label: string, options: string[]) => (
    <select
      value={filters[key]}
      onChange={(e) => onChange({ ...filters, [key]: (e.target as HTMLSelectElement).value })}
      data-testid={`filter-${key}`}
      aria-label={label}
    >
      <option value="">any {label}</option>
      {options.map((o) => (
        <option key={o} value={o}>
          {o}
        </option>
      ))}
    </select>
  );
  return (
    <div class="filters" data-testid="filters">
      {select("family", "family", families)}
      {select("quantization", "quantization", quantizations)}
      {select("size", "size", Object.keys(sizes))}
      <label>
        <input
          type="checkbox"
          checked={filters.fitsOnly}
          onChange={(e) => onChange({ ...filters, fitsOnly: (e.target as HTMLInputElement).checked })}
          data-testid="filter-fits"
        />{" "}
        only what fits and loads here
      </label>
    </div>
  );
}
