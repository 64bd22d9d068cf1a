// Downloads from the Hub, followed for as long as the page is open (on any page): each pull's
// latest status, from its event stream. Leaving the stream does not stop a download on the
// server; cancel does; pulling again resumes or joins it.
import { useEffect, useState } from "preact/hooks";
import { getJson, postJson, streamJson, type PullStatus } from "./api";

export interface PullView extends Partial<PullStatus> {
  repo: string;
  state: PullStatus["state"];
  /** Connected to its event stream now. */
  following: boolean;
  /** Asked to be served once downloaded (Discover's one click), and how that went. */
  serve?: "waiting" | "loading" | "serving" | "failed";
  serveMessage?: string;
}

const pulls = new Map<string, PullView>();
const listeners = new Set<() => void>();

function set(repo: string, patch: Partial<PullView>) {
  const prev = pulls.get(repo) ?? { repo, state: "running" as const, following: false };
  pulls.set(repo, { ...prev, ...patch });
  listeners.forEach((l) => l());
}

export function startPull(repo: string, gguf?: string, options: { serve?: boolean } = {}) {
  if (options.serve) set(repo, { serve: "waiting", serveMessage: undefined });
  if (pulls.get(repo)?.following) return;
  set(repo, { state: "running", message: undefined, following: true });
  const body: Record<string, string> = { repo };
  if (gguf) body.gguf = gguf;
  let finished = false;
  streamJson<PullStatus>("/admin/pull", { method: "POST", json: body }, (event) => {
    finished = event.state !== "running";
    set(repo, { ...event, following: !finished });
    if (event.state === "done" && pulls.get(repo)?.serve === "waiting") serveModel(repo, event.id ?? repo);
  })
    .then(() => {
      if (!finished) set(repo, { following: false, state: "failed", message: "lost the progress stream; resume to follow it again" });
    })
    .catch((e: Error) => set(repo, { following: false, state: "failed", message: e.message }));
}

/** Loads a model (a finished pull's, under its catalog id), so requests go to it. */
export async function serveModel(repo: string, id: string) {
  set(repo, { serve: "loading", serveMessage: undefined });
  try {
    await postJson("/admin/load", { model: id });
    set(repo, { serve: "serving" });
  } catch (e) {
    set(repo, { serve: "failed", serveMessage: (e as Error).message });
  }
}

/** Loads a model already on disk from Discover (no pull to follow): shown as a finished one. */
export function serveLocal(repo: string) {
  if (!pulls.has(repo)) set(repo, { state: "done", following: false });
  return serveModel(repo, repo);
}

export async function cancelPull(repo: string) {
  await postJson("/admin/pull/cancel", { repo });
}

/** Follows the pulls the server is running (started by another window, the CLI, or before a reload). */
export async function attachRunning() {
  const running = await getJson<PullStatus[]>("/admin/pulls");
  for (const p of running) {
    if (p.state === "running") startPull(p.repo);
    else if (!pulls.has(p.repo)) set(p.repo, { ...p, following: false });
  }
}

export function usePulls(): Map<string, PullView> {
  const [, bump] = useState(0);
  useEffect(() => {
    const l = () => bump((n) => n + 1);
    listeners.add(l);
    return () => {
      listeners.delete(l);
    };
  }, []);
  return pulls;
}
