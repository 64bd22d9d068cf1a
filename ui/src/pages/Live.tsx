import { useEffect, useMemo, useState } from "preact/hooks";
import type uPlot from "uplot";
import { getJson, streamJson, type CacheMiss, type FinishedRequest, type MetricsEvent } from "../api";
import { Chart } from "../components/Chart";
import { ErrorBox } from "../components/common";
import { ClusterSection } from "../components/Cluster";
import { bytes, ms, rate } from "../format";

/** Fifteen minutes: what the server keeps too (a sample a second), so the page opened after
 * the traffic starts from it. */
const WINDOW_MS = 15 * 60_000;

interface Sample {
  t: number;
  batch: number;
  queued: number;
  prefill: number;
  decode: number;
  held: number;
  active: number;
  cache: number;
  kv: number;
  predicted: number;
  measured: number;
  budget: number | null;
}

// Kept while the app is open, so coming back to this page shows what came before.
const history: Sample[] = [];
let latest: MetricsEvent | null = null;

function sampleOf(e: MetricsEvent): Sample {
  const sum = (f: (m: MetricsEvent["models"][number]) => number) => e.models.reduce((a, m) => a + (f(m) || 0), 0);
  return {
    t: e.time_ms,
    batch: sum((m) => m.batch_size),
    queued: sum((m) => m.queued),
    prefill: sum((m) => m.prefill_tokens_per_sec),
    decode: sum((m) => m.decode_tokens_per_sec),
    held: e.resident_bytes ?? e.mlx_active_bytes,
    active: e.mlx_active_bytes,
    cache: e.mlx_cache_bytes,
    kv: sum((m) => m.kv_bytes),
    predicted: sum((m) => m.step_predicted_bytes),
    measured: sum((m) => m.step_measured_bytes),
    budget: e.memory_budget_bytes,
  };
}

function push(e: MetricsEvent) {
  latest = e;
  history.push(sampleOf(e));
  const cutoff = e.time_ms - WINDOW_MS;
  while (history.length && history[0].t < cutoff) history.shift();
}

/** The server's recorded samples, once, before the live stream (only what is older than what
 * the page already has). */
async function loadHistory(): Promise<void> {
  const { samples } = await getJson<{ samples: MetricsEvent[] }>("/admin/metrics/history");
  const first = history[0]?.t ?? Infinity;
  const older = samples.filter((s) => s.time_ms < first).map(sampleOf);
  history.unshift(...older);
}

function column(f: (s: Sample) => number | null): (number | null)[] {
  return history.map(f);
}

export function LivePage() {
  const [tick, setTick] = useState(0);
  const [error, setError] = useState<string | null>(null);
  const [connected, setConnected] = useState(false);

  useEffect(() => {
    const abort = new AbortController();
    let retry: ReturnType<typeof setTimeout> | undefined;
    const connect = () => {
      streamJson<MetricsEvent>("/admin/metrics/stream", { signal: abort.signal }, (e) => {
        push(e);
        setConnected(true);
        setError(null);
        setTick((n) => n + 1);
      })
        .catch((e: Error) => {
          if (abort.signal.aborted) return;
          setError(e.message);
        })
        .finally(() => {
          if (abort.signal.aborted) return;
          setConnected(false);
          retry = setTimeout(connect, 2000);
        });
    };
    loadHistory()
      .catch(() => {})
      .finally(() => {
        setTick((n) => n + 1);
        connect();
      });
    return () => {
      abort.abort();
      clearTimeout(retry);
    };
  }, []);

  const x = useMemo(() => history.map((s) => s.t / 1000), [tick]);
  const load = useMemo(() => [x, column((s) => s.batch), column((s) => s.queued)] as uPlot.AlignedData, [tick]);
  const speed = useMemo(() => [x, column((s) => s.prefill), column((s) => s.decode)] as uPlot.AlignedData, [tick]);
  const memory = useMemo(
    () =>
      [
        x,
        column((s) => s.held),
        column((s) => s.active),
        column((s) => s.cache),
        column((s) => s.kv),
        column((s) => s.predicted),
        column((s) => s.measured),
        column((s) => s.budget),
      ] as uPlot.AlignedData,
    [tick],
  );

  const models = latest?.models ?? [];
  const recent = latest?.recent ?? [];
  const total = (f: (m: (typeof models)[number]) => number) => models.reduce((a, m) => a + (f(m) || 0), 0);

  return (
    <section>
      <div class="page-head">
        <h1>Live</h1>
        <span class={`dot ${connected ? "on" : ""}`} data-testid="live-connected" data-connected={String(connected)}>
          {connected ? "streaming" : "connecting…"}
        </span>
        {latest && (
          <div class="summary" data-testid="memory-summary">
            <span title="What the process holds (resident memory)">
              held <b>{bytes(latest.resident_bytes)}</b>
            </span>
            <span title="The memory ceiling: MLX's memory limit, and what admission keeps every step under">
              ceiling <b>{bytes(latest.memory_budget_bytes)}</b>
            </span>
            <span title="MLX's buffer cache (freed buffers kept for reuse) and its limit; emptied after a few seconds idle">
              buffer cache <b>{bytes(latest.mlx_cache_bytes)}</b> / {bytes(latest.cache_limit_bytes)}
            </span>
            <span title="Metal's wired limit (memory kept resident for the GPU); not set off Metal">
              wired <b>{latest.wired_limit_bytes ? bytes(latest.wired_limit_bytes) : "not set"}</b>
            </span>
            <span title="Running requests parked for memory (resumed later with the same output)" data-testid="parked">
              parked <b>{total((m) => m.parked_total)}</b>
            </span>
            <span
              title="Requests answered 503 + Retry-After: waited longer than --max-queue-wait / their prompt did not fit under the ceiling in time"
              data-testid="refused"
            >
              refused <b>{total((m) => m.refused_waited_total)}</b> waited · <b>{total((m) => m.refused_memory_total)}</b>{" "}
              memory
            </span>
          </div>
        )}
      </div>
      <ErrorBox error={error} />
      {latest?.waiting && <ErrorBox error={`${latest.waiting.id}: ${latest.waiting.reason}`} />}
      {models
        .filter((m) => m.fault && !m.cluster)
        .map((m) => (
          <ErrorBox key={m.id} error={`${m.id}: ${m.fault}`} />
        ))}
      {models.map((m) => m.cluster && <ClusterSection key={m.id} model={m.id} cluster={m.cluster} fault={m.fault} />)}
      <div class="table-wrap">
        <table class="compact" data-testid="model-summary">
          <thead>
            <tr>
              <th>Model</th>
              <th class="num">Batch</th>
              <th class="num">Running</th>
              <th class="num">Queued</th>
              <th class="num">Prefill</th>
              <th class="num">Decode</th>
              <th class="num">KV used / reserved / budget</th>
              <th class="num">Requests</th>
              <th class="num">Tokens out</th>
              <th class="num" title="Speculative decoding: drafted tokens the model accepted">Drafts accepted</th>
              <th class="num">Prefix cache: hit rate · reused · RAM / disk</th>
            </tr>
          </thead>
          <tbody>
            {models.length === 0 && (
              <tr>
                <td colSpan={11} class="muted">
                  No model loaded.
                </td>
              </tr>
            )}
            {models.map((m) => (
              <tr key={m.id} data-testid="model-summary-row" data-model={m.id}>
                <td class="model-id">{m.id}</td>
                <td class="num">{m.batch_size}</td>
                <td class="num">{m.running}</td>
                <td class="num">{m.queued}</td>
                <td class="num">{rate(m.prefill_tokens_per_sec)}</td>
                <td class="num">{rate(m.decode_tokens_per_sec)}</td>
                <td class="num">
                  {bytes(m.kv_bytes)} / {bytes(m.kv_reserved_bytes)} / {bytes(m.kv_budget_bytes)}
                </td>
                <td class="num">{m.requests_total}</td>
                <td class="num">{m.generated_tokens_total}</td>
                <td class="num" data-testid="drafts">
                  {acceptance(m.draft_tokens_total, m.draft_accepted_total)}
                </td>
                <td class="num" data-testid="prefix-cache">
                  {hitRate(m.prefix_cache_hits, m.prefix_cache_misses)} · {m.prefix_cache_tokens_reused} tok ·{" "}
                  {bytes(m.prefix_cache_bytes)} / {bytes(m.prefix_cache_disk_bytes)}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      <div class="charts">
        <Chart
          title="Batch size & queue depth"
          testid="chart-batch"
          series={[
            { label: "running batch", color: "#3b82f6" },
            { label: "queued", color: "#f59e0b" },
          ]}
          data={load}
          axis={(v) => (Number.isInteger(v) ? String(v) : "")}
        />
        <Chart
          title="Tokens per second"
          testid="chart-tokens"
          series={[
            { label: "prefill", color: "#8b5cf6", value: (v) => rate(v) },
            { label: "decode", color: "#10b981", value: (v) => rate(v) },
          ]}
          data={speed}
          axis={(v) => (v >= 1000 ? `${(v / 1000).toFixed(1)}k` : String(Math.round(v * 10) / 10))}
        />
        <Chart
          title="Memory"
          testid="chart-memory"
          series={[
            { label: "held", color: "#3b82f6" },
            { label: "MLX active", color: "#6366f1" },
            { label: "buffer cache", color: "#94a3b8" },
            { label: "KV cache", color: "#10b981" },
            { label: "step predicted", color: "#f59e0b", dash: [2, 3] },
            { label: "step measured", color: "#d97706" },
            { label: "ceiling", color: "#ef4444", dash: [4, 4] },
          ]}
          data={memory}
          axis={bytes}
        />
      </div>
      <h2>Recent requests</h2>
      <div class="table-wrap">
        <table class="compact" data-testid="recent-requests">
          <thead>
            <tr>
              <th>Finished</th>
              <th>Model</th>
              <th class="num">Queue wait</th>
              <th class="num">TTFT</th>
              <th class="num">Prompt</th>
              <th class="num">Reused</th>
              <th class="num">Completion</th>
              <th class="num">Speed</th>
              <th>Where the time went</th>
              <th>Reason</th>
            </tr>
          </thead>
          <tbody>
            {recent.length === 0 && (
              <tr>
                <td colSpan={10} class="muted">
                  No finished requests yet.
                </td>
              </tr>
            )}
            {recent.map((r) => (
              <tr key={`${r.model}/${r.request_id}/${r.finished_ms}`} data-testid="recent-row">
                <td>{new Date(r.finished_ms).toLocaleTimeString()}</td>
                <td class="model-id">{r.model}</td>
                <td class="num">{ms(r.queue_ms)}</td>
                <td class="num">{ms(r.ttft_ms)}</td>
                <td class="num">{r.prompt_tokens}</td>
                <td class="num" data-testid="recent-reused" title={missText(r.cache_miss)}>
                  {r.cached_tokens ?? 0}
                  {r.cache_miss && <span class="warn-text"> ⚠</span>}
                </td>
                <td class="num">{r.completion_tokens}</td>
                <td class="num">{rate(r.tokens_per_sec)}</td>
                <td>
                  <Waterfall r={r} />
                </td>
                <td>
                  {r.reason}
                  {r.cache_miss && (
                    <div class="muted small-text" data-testid="cache-miss">
                      {missText(r.cache_miss)}
                    </div>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </section>
  );
}

/** Hits over all lookups, as a percentage ("–" before any). */
/** "62 % of 240": the share of drafted tokens accepted; "—" before any were drafted. */
function acceptance(drafted: number, accepted: number): string {
  if (!drafted) return "—";
  return `${Math.round((100 * (accepted ?? 0)) / drafted)} % of ${drafted}`;
}

function hitRate(hits: number, misses: number): string {
  const all = (hits ?? 0) + (misses ?? 0);
  return all === 0 ? "–" : `${Math.round((100 * hits) / all)}%`;
}

/** Where a prompt left a cached sequence of its conversation, in words. */
function missText(miss: CacheMiss | null | undefined): string {
  if (!miss) return "";
  const where = miss.message == null ? `token ${miss.position}` : `message ${miss.message + 1} (token ${miss.position})`;
  return `Cache left at ${where}: …${miss.before}⟂${miss.after}… (the cached sequence went on to token ${miss.cached_through})`;
}

/** Queue, cache restore, prefill, decode: one bar, each part as wide as its share of the time. */
function Waterfall({ r }: { r: FinishedRequest }) {
  const restore = r.restore_ms ?? 0;
  const parts = [
    { name: "queue", ms: r.queue_ms ?? 0, color: "#f59e0b" },
    { name: "cache restore", ms: restore, color: "#06b6d4" },
    { name: "prefill", ms: Math.max(0, (r.prefill_ms ?? 0) - restore), color: "#8b5cf6" },
    { name: "decode", ms: r.decode_ms ?? 0, color: "#10b981" },
  ];
  const total = parts.reduce((a, p) => a + p.ms, 0);
  const title = parts.map((p) => `${p.name} ${ms(p.ms)}`).join(" · ");
  return (
    <div class="waterfall" title={title} data-testid="waterfall">
      {total > 0 &&
        parts
          .filter((p) => p.ms > 0)
          .map((p) => <span key={p.name} style={{ width: `${(100 * p.ms) / total}%`, background: p.color }} />)}
    </div>
  );
}
