// Discover's opening list: the models worth running, per use, with what each would take and
// serve on this Mac (the server's cost model), the best one that fits first. One click
// downloads the quantization offered and serves it; a model on disk is served at once.
import { useEffect, useState } from "preact/hooks";
import { getJson, type HubStatus, type RecommendedModel, type Recommendations } from "../api";
import { bytes, params } from "../format";
import { serveLocal, serveModel, startPull, type PullView } from "../pulls";
import { Badge, ErrorBox, Spinner } from "./common";
import { fitKind, PlanContext } from "./PlanCell";
import { PullControls } from "./PullControls";
import { modelPageHref } from "../links";

/** The Macs one may plan for besides this one, in GB (the memory configurations Apple sells). */
const MACHINE_SIZES = [8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512];

/** "a 16 GB Mac", "an 8 GB Mac" (said "eight", "eighteen", "eighty"). */
function aMac(gb: number): string {
  return `${/^(8|18|8\d)$/.test(String(gb)) ? "an" : "a"} ${gb} GB Mac`;
}

export interface RecommendedState {
  list: Recommendations | null;
  hub: HubStatus | null;
  error: string | null;
  /** Planned for a Mac with this many GB; null: this Mac. */
  machineGb: number | null;
  setMachineGb: (gb: number | null) => void;
}

export function useRecommendations(): RecommendedState {
  const [list, setList] = useState<Recommendations | null>(null);
  const [hub, setHub] = useState<HubStatus | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [machineGb, setMachineGb] = useState<number | null>(null);
  useEffect(() => {
    const query = machineGb == null ? "" : `?machine_gb=${machineGb}`;
    let current = true;
    getJson<Recommendations>(`/admin/recommended${query}`)
      .then((l) => current && (setList(l), setError(null)))
      .catch((e: Error) => current && setError(e.message));
    return () => {
      current = false;
    };
  }, [machineGb]);
  useEffect(() => {
    // Apart: the list needs no network, and shows before the Hub has answered (or not).
    getJson<HubStatus>("/admin/hub")
      .then(setHub)
      .catch(() => setHub(null));
  }, []);
  return { list, hub, error, machineGb, setMachineGb };
}

export function RecommendedList({ state, pulls }: { state: RecommendedState; pulls: Map<string, PullView> }) {
  const { list, hub, error, machineGb, setMachineGb } = state;
  if (error) return <ErrorBox error={error} />;
  if (!list) return <Spinner label="loading recommendations" />;
  return (
    <div class="recommended" data-testid="recommended">
      <div class="rec-head">
        <h2>Recommended for {machineGb == null ? "this Mac" : aMac(machineGb)}</h2>
        <label class="rec-machine muted small-text">
          Plan for{" "}
          <select
            value={machineGb == null ? "" : String(machineGb)}
            onChange={(e) => {
              const v = (e.target as HTMLSelectElement).value;
              setMachineGb(v === "" ? null : Number(v));
            }}
            data-testid="rec-machine"
          >
            <option value="">this Mac</option>
            {MACHINE_SIZES.map((gb) => (
              <option key={gb} value={String(gb)}>
                {aMac(gb)}
              </option>
            ))}
          </select>
        </label>
        <span
          class="muted small-text"
          data-testid="rec-ceiling"
          title={machineGb == null ? "the memory ceiling FastMLX keeps to (Server page)" : "FastMLX's default share of that Mac's memory"}
        >
          {bytes(list.ceiling_bytes)} for models · list of {list.updated}
        </span>
      </div>
      {hub && !hub.reachable && (
        <div class="note warn-note" data-testid="offline-note">
          The Hugging Face Hub cannot be reached ({hub.error ?? "no answer"}). The list still shows what fits this
          Mac; downloading needs a connection.
        </div>
      )}
      {list.uses.map((use) => (
        <section class="rec-use" key={use.id} data-testid="rec-use" data-use={use.id}>
          <h3>{use.title}</h3>
          <p class="muted small-text">{use.blurb}</p>
          <div class="rec-grid">
            {use.models.map((m) => (
              // Keyed by the plan's choice too: a card keeps the quantization picked in it only
              // while the plan offers the same one (another Mac's plan brings its own choice).
              <RecommendedCard key={`${m.name}:${m.choice}`} model={m} pulls={pulls} />
            ))}
          </div>
        </section>
      ))}
    </div>
  );
}

function RecommendedCard({ model, pulls }: { model: RecommendedModel; pulls: Map<string, PullView> }) {
  const [choice, setChoice] = useState(model.choice);
  const q = model.quantizations[choice] ?? model.quantizations[0];
  const pull = pulls.get(q.repo);
  const fit = q.fit ?? "too big";
  return (
    <div
      class={`rec-card ${fit === "too big" ? "rec-too-big" : ""}`}
      data-testid="rec-model"
      data-repo={q.repo}
      data-fit={fit}
    >
      <div class="rec-title">
        <a class="rec-name" href={modelPageHref("repo", q.repo)}>
          {model.name}
        </a>
        <Badge kind={fitKind[fit] ?? "muted"} testid="rec-fit">
          {fit}
        </Badge>
        {model.kind !== "chat" && <Badge kind="muted">{model.kind}</Badge>}
      </div>
      <p class="rec-summary small-text">{model.summary}</p>
      <div class="hit-meta muted small-text">
        {model.parameters != null && <span>{params(model.parameters)} params</span>}
        {model.model_type && <span>{model.model_type}</span>}
        {q.weights_bytes != null && <span data-testid="rec-size">~{bytes(q.weights_bytes)}</span>}
        {q.plan ? <PlanContext plan={q.plan} /> : null}
      </div>
      <div class="rec-actions">
        {model.quantizations.length > 1 ? (
          <select
            value={String(choice)}
            onChange={(e) => setChoice(Number((e.target as HTMLSelectElement).value))}
            data-testid="rec-quant"
            aria-label="quantization"
          >
            {model.quantizations.map((option, i) => (
              <option key={option.repo} value={String(i)}>
                {option.label} · {option.fit ?? "?"}
              </option>
            ))}
          </select>
        ) : (
          <span class="muted small-text">{q.label}</span>
        )}
        <RecommendedAction repo={q.repo} downloaded={q.downloaded} pull={pull} />
      </div>
    </div>
  );
}

/** Get (download, then serve), Serve (on disk already), or where that stands. */
function RecommendedAction({ repo, downloaded, pull }: { repo: string; downloaded: boolean; pull: PullView | undefined }) {
  const get = () => startPull(repo, undefined, { serve: true });
  if (pull?.serve === "serving") {
    return (
      <span data-testid="rec-serving">
        <Badge kind="ok">serving</Badge> <a href="#/chat">Chat</a>
      </span>
    );
  }
  if (pull?.serve === "loading") return <Spinner label="loading the model" />;
  if (pull?.serve === "failed") {
    return (
      <span class="rec-failed">
        <span class="error-text" data-testid="rec-message">
          {pull.serveMessage}
        </span>
        <button class="small" onClick={() => serveModel(repo, pull.id ?? repo)}>
          Retry
        </button>
      </span>
    );
  }
  if (pull?.state === "running") return <PullControls repo={repo} pull={pull} />;
  if (downloaded || pull?.state === "done") {
    return (
      <button class="small primary" onClick={() => serveLocal(repo)} data-testid="rec-serve">
        Serve
      </button>
    );
  }
  if (pull && (pull.state === "failed" || pull.state === "cancelled")) {
    return (
      <span class="rec-failed">
        <span class={pull.state === "failed" ? "error-text" : "muted"} data-testid="rec-message">
          {pull.state === "failed" ? pull.message ?? "failed" : "cancelled"}
        </span>
        <button class="small primary" onClick={get} data-testid="rec-resume">
          Resume
        </button>
      </span>
    );
  }
  return (
    <button class="small primary" onClick={get} data-testid="rec-get" title={`download ${repo}, then serve it`}>
      Get
    </button>
  );
}
