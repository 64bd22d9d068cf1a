import { useState } from "preact/hooks";
import { Badge } from "./common";
import { bytes, duration, percent } from "../format";
import { cancelPull, startPull, type PullView } from "../pulls";

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

export function PullControls({ repo, pull, gguf = false }: { repo: string; pull: PullView | undefined; gguf?: boolean }) {
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
