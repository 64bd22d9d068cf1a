// Talking to FastMLX: the base URL and API key (same origin in a browser; injected by the
// desktop app as window.__FASTMLX__), JSON calls with errors in OpenAI's envelope, and
// server-sent-event streams read with fetch (EventSource can neither POST nor send headers).

declare global {
  interface Window {
    __FASTMLX__?: { apiBase?: string; apiKey?: string | null; desktop?: boolean };
    __TAURI__?: { core: { invoke: (name: string, args?: Record<string, unknown>) => Promise<unknown> } };
  }
}

const KEY_STORAGE = "fastmlx.apiKey";

export const apiBase: string = (window.__FASTMLX__?.apiBase ?? "").replace(/\/+$/, "");
export const isDesktop: boolean = Boolean(window.__FASTMLX__?.desktop);

/** The key the desktop app injected (it knows its server's), else the one stored on the Server page. */
export function apiKey(): string | null {
  return window.__FASTMLX__?.apiKey || localStorage.getItem(KEY_STORAGE) || null;
}

export function storedApiKey(): string {
  return localStorage.getItem(KEY_STORAGE) ?? "";
}

export function storeApiKey(key: string) {
  if (key) localStorage.setItem(KEY_STORAGE, key);
  else localStorage.removeItem(KEY_STORAGE);
}

/** The server's own address: the injected base, else this page's origin. */
export function serverOrigin(): string {
  return apiBase || window.location.origin;
}

export class ApiError extends Error {
  status: number;
  type: string | null;
  code: string | null;
  constructor(message: string, status: number, type: string | null = null, code: string | null = null) {
    super(message);
    this.status = status;
    this.type = type;
    this.code = code;
  }
}

function headers(json: boolean): Record<string, string> {
  const h: Record<string, string> = {};
  if (json) h["Content-Type"] = "application/json";
  const key = apiKey();
  if (key) h["Authorization"] = `Bearer ${key}`;
  return h;
}

async function errorOf(res: Response): Promise<ApiError> {
  let message = `${res.status} ${res.statusText}`.trim();
  let type: string | null = null;
  let code: string | null = null;
  try {
    const body = await res.json();
    if (body?.error?.message) {
      message = body.error.message;
      type = body.error.type ?? null;
      code = body.error.code ?? null;
    }
  } catch {
    /* not JSON */
  }
  if (res.status === 401) message += " (set the API key on the Server page)";
  return new ApiError(message, res.status, type, code);
}

/** A fetch to the API; throws ApiError on a 4xx/5xx answer or when the server cannot be reached. */
export async function request(path: string, init: RequestInit & { json?: unknown } = {}): Promise<Response> {
  const { json, ...rest } = init;
  let res: Response;
  try {
    res = await fetch(apiBase + path, {
      ...rest,
      headers: { ...headers(json !== undefined), ...(rest.headers as Record<string, string> | undefined) },
      body: json !== undefined ? JSON.stringify(json) : rest.body,
    });
  } catch (e) {
    if ((e as Error).name === "AbortError") throw e;
    throw new ApiError(`cannot reach FastMLX at ${serverOrigin()}: ${(e as Error).message}`, 0);
  }
  if (!res.ok) throw await errorOf(res);
  return res;
}

export async function getJson<T>(path: string, signal?: AbortSignal): Promise<T> {
  return (await request(path, { signal })).json();
}

export async function postJson<T>(path: string, body: unknown, signal?: AbortSignal): Promise<T> {
  return (await request(path, { method: "POST", json: body, signal })).json();
}

/**
 * Reads a server-sent-event body, calling onData with each event's data (lines joined), until
 * the stream ends, `[DONE]` arrives, or the signal aborts.
 */
export async function readEvents(res: Response, onData: (data: string) => void): Promise<void> {
  if (!res.body) throw new ApiError("the server sent no stream", res.status);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let data: string[] = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let nl: number;
      while ((nl = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, nl).replace(/\r$/, "");
        buffer = buffer.slice(nl + 1);
        if (line === "") {
          if (data.length) {
            const event = data.join("\n");
            data = [];
            if (event === "[DONE]") return;
            onData(event);
          }
        } else if (line.startsWith("data:")) {
          data.push(line.slice(5).replace(/^ /, ""));
        }
        // comments (":keepalive"), event:, id:, retry: are ignored
      }
    }
    if (data.length && data.join("\n") !== "[DONE]") onData(data.join("\n"));
  } finally {
    reader.releaseLock();
  }
}

/** POST (or GET) a request answered by an event stream, parsing each event as JSON. */
export async function streamJson<T>(
  path: string,
  init: RequestInit & { json?: unknown },
  onEvent: (event: T) => void,
): Promise<void> {
  const res = await request(path, { ...init, headers: { Accept: "text/event-stream" } });
  await readEvents(res, (data) => {
    let event: T;
    try {
      event = JSON.parse(data);
    } catch {
      return;
    }
    onEvent(event);
  });
}

// --- the shapes of the admin API -----------------------------------------------------------

/** What a model serves. */
export type ModelKind = "chat" | "embedding" | "reranker";

export interface LocalModel {
  id: string;
  kind: ModelKind;
  path: string;
  source: "fastmlx" | "hf-cache" | "lmstudio" | "folder" | "path";
  owned: boolean;
  loaded: boolean;
  format: string;
  architecture: string | null;
  parameters: number | null;
  quantization: string | null;
  context_length: number | null;
  size_bytes: number;
  unloadable_reason: string | null;
  /** What it serves under the server's memory ceiling (null when its shape cannot be read). */
  plan?: ServingPlan | null;
}

/** The memory planner's answer for a model on this machine (`fastmlx inspect` prints the same). */
export interface ServingPlan {
  ceiling_bytes: number;
  weights_bytes: number;
  kv_bytes_per_token: number;
  kv_budget_bytes: number;
  /** Requests at once the plan is for. */
  rows: number;
  /** Context each of them gets (at most the model's own). */
  context_tokens: number;
  max_context: number;
  fit: "fits" | "tight" | "too big";
  /** Context each request gets with the KV cache quantized (`--kv-bits 8` / `4`; null where the model's heads cannot be). */
  context_tokens_kv8?: number | null;
  context_tokens_kv4?: number | null;
}

export interface LoadedModel {
  id: string;
  kind: ModelKind;
  path: string;
  memory_bytes: number;
  weights_bytes: number;
  kv_budget_bytes: number;
  idle_secs: number;
  expires_in_secs: number | null;
  running: number;
  queued: number;
  /** The context window it serves (the model's own, or less under --ctx). */
  context_length: number;
  /** The draft model loaded with it (--draft-model). */
  draft_model?: string;
  /** Its own multi-token-prediction head drafts for it. */
  mtp_head?: boolean;
  /** Why it cannot serve: its cluster lost a machine. */
  fault?: string;
  /** Its cluster, where it is split across several machines (serve --cluster). */
  cluster?: ClusterStatus;
}

/** A model split across machines: each machine, each link as measured when the cluster formed,
 * and what rank 0's steps through the pipeline cost (sums since it loaded). */
export interface ClusterStatus {
  backend: string;
  /** How the model is split: `pipeline` (each machine its layers) or `tensor` (each machine its
   * share of every layer's heads and columns, the outputs summed). */
  parallel?: string;
  nodes: { rank: number; host: string; room_bytes: number; first_layer: number; end_layer: number; ends: boolean }[];
  links: { from: number; to: number; round_trip_ms: number; megabytes_per_second: number }[];
  /** The host file's machines served without (gone past `--drop-after` when it formed). */
  without: string[];
  /** Of those, the machines back (checked in again), to be taken in. */
  back?: string[];
  /** Of those, the machines back but held off since their take-in failed: tried again by
   * themselves in `seconds_left`, or sooner when a person takes them back. */
  held?: { machine: string; seconds_left: number }[];
  /** When a machine that is back is taken in: `idle` (the server idle a few seconds) or `asked`
   * (`POST /admin/cluster/take-back`). */
  take_back?: "idle" | "asked";
  steps: number;
  tokens: number;
  bytes_per_hop: number;
  wait_seconds: number;
  step_seconds: number;
  /** By tensors: the steps whose sums rank 0 timed apart from its layers (one now and then),
   * prompt steps (several positions per row) and decode steps apart. */
  sums_timed: { prompt: TimedSteps; decode: TimedSteps };
}

export interface TimedSteps {
  steps: number;
  /** Seconds those steps spent in the sums (the transfers, and any machine still computing). */
  sum_seconds: number;
  /** Seconds of those steps in all (a timed step runs longer than others). */
  step_seconds: number;
}

export interface PullProgress {
  file: string;
  file_done: number;
  file_total: number;
  done: number;
  total: number;
  bytes_per_sec: number;
  eta_secs: number | null;
  files_done: number;
  files_total: number;
}

export interface PullStatus {
  repo: string;
  state: "running" | "done" | "failed" | "cancelled";
  id?: string;
  path?: string;
  message?: string;
  progress: PullProgress;
}

export interface ServerStatus {
  loaded: LoadedModel[];
  /** A model split across machines while its cluster forms (again, after a lost machine). */
  waiting?: { id: string; reason: string } | null;
  memory_budget_bytes: number | null;
  machine_memory_bytes: number | null;
  mlx_active_bytes: number;
  mlx_cache_bytes: number;
  pulls: PullStatus[];
}

export interface SearchHit {
  id: string;
  downloads: number;
  likes: number;
  tags: string[];
  last_modified: string | null;
  library: string | null;
  gated: boolean | string;
  parameters: number | null;
  storage_bytes: number | null;
  /** How the weights are stored, e.g. "4-bit", "BF16", "GGUF Q4_K_M, Q8_0". */
  quantization: string | null;
  memory_needed_bytes: number | null;
  /** From `plan` when there is one, else from the size alone. */
  fit: "fits" | "tight" | "too big" | null;
  /** From the repo's config.json, when the Hub has one. */
  model_type: string | null;
  /** Why FastMLX cannot load it, when its config says so. */
  unsupported: string | null;
  /** What it would serve on this machine (as for a model on disk). */
  plan: ServingPlan | null;
}

/** One quantization of a recommended model, as it would be on this machine. */
export interface RecommendedQuant {
  repo: string;
  label: string;
  weights_bytes: number | null;
  memory_needed_bytes: number | null;
  fit: "fits" | "tight" | "too big" | null;
  /** Chat models: the context four requests get here (with and without KV quantization). */
  plan: ServingPlan | null;
  /** On disk already: served with one click, no download. */
  downloaded: boolean;
}

export interface RecommendedModel {
  name: string;
  kind: ModelKind;
  summary: string;
  uses: string[];
  model_type: string | null;
  parameters: number | null;
  max_context: number | null;
  /** The badge of the quantization offered. */
  fit: RecommendedQuant["fit"];
  /** Index of the quantization offered: the best one that fits here. */
  choice: number;
  quantizations: RecommendedQuant[];
}

/** `GET /admin/recommended`: the curated list, per use, the best model that fits first. */
export interface Recommendations {
  version: number;
  updated: string;
  ceiling_bytes: number;
  uses: { id: string; title: string; blurb: string; models: RecommendedModel[] }[];
}

/** `GET /admin/hub`: whether downloads can work from here. */
export interface HubStatus {
  endpoint: string;
  reachable: boolean;
  error: string | null;
}

export interface Settings {
  /** null where the server does not listen on TCP (the desktop app before it starts). */
  api_url: string | null;
  host: string | null;
  port: number | null;
  api_key_set: boolean;
  max_batch: number;
  memory_budget_mb: number | null;
  prefix_cache_mb: number;
  keep_alive_secs: number | null;
  models_dir: string;
  /** KV-cache quantization for models loaded from now on: 0 (off), 8 or 4 bits, from `kv_start` tokens on. */
  kv_bits: number;
  kv_group_size: number;
  kv_start: number;
  /** Models with a KV format of their own: `MODEL=BITS/GROUP/START` or `MODEL=off`. */
  model_kv: string[];
}

export interface ModelMetrics {
  id: string;
  running: number;
  queued: number;
  batch_size: number;
  prefill_tokens_per_sec: number;
  decode_tokens_per_sec: number;
  kv_bytes: number;
  kv_reserved_bytes: number;
  kv_budget_bytes: number;
  requests_total: number;
  generated_tokens_total: number;
  /** Speculative decoding: tokens drafted, and those the model accepted. */
  draft_tokens_total: number;
  draft_accepted_total: number;
  prefix_cache_hits: number;
  prefix_cache_misses: number;
  prefix_cache_tokens_reused: number;
  prefix_cache_bytes: number;
  prefix_cache_disk_bytes: number;
  /** The memory governor's last measured step: predicted and measured transient bytes. */
  step_predicted_bytes: number;
  step_measured_bytes: number;
  /** Rows parked for memory (resumed later), requests refused after waiting or for memory. */
  parked_total: number;
  refused_waited_total: number;
  refused_memory_total: number;
  /** Why it cannot serve: its cluster lost a machine. */
  fault?: string;
  cluster?: ClusterStatus;
}

/** Where a prompt left a cached sequence of the same conversation (see the Live page). */
export interface CacheMiss {
  position: number;
  cached_through: number;
  message: number | null;
  before: string;
  after: string;
}

export interface FinishedRequest {
  model: string;
  request_id: string;
  finished_ms: number;
  queue_ms: number;
  restore_ms?: number;
  prefill_ms?: number;
  ttft_ms: number | null;
  decode_ms?: number;
  prompt_tokens: number;
  /** Prompt tokens reused from the prefix cache. */
  cached_tokens: number;
  completion_tokens: number;
  tokens_per_sec: number | null;
  reason: string;
  cache_miss: CacheMiss | null;
}

export interface MetricsEvent {
  time_ms: number;
  mlx_active_bytes: number;
  mlx_cache_bytes: number;
  /** The process's memory ceiling. */
  memory_budget_bytes: number | null;
  /** What the process holds (resident, or MLX's count where larger). */
  resident_bytes: number;
  cache_limit_bytes: number;
  /** Metal's wired limit as set (0: not set, as off Metal). */
  wired_limit_bytes: number;
  models: ModelMetrics[];
  recent: FinishedRequest[];
  /** A model split across machines while its cluster forms (again, after a lost machine). */
  waiting?: { id: string; reason: string };
}

/** Model ids have slashes (org/name): each segment is encoded, the slashes kept. */
export function modelPath(id: string): string {
  return id.split("/").map(encodeURIComponent).join("/");
}
