// What only the desktop app can do goes through Tauri's invoke when it is there; a browser
// gets the nearest equivalent (or nothing, for launch at login).

function invoke(name: string, args?: Record<string, unknown>): Promise<unknown> | null {
  const tauri = window.__TAURI__;
  return tauri?.core?.invoke ? tauri.core.invoke(name, args) : null;
}

export const hasNative = (): boolean => Boolean(window.__TAURI__?.core?.invoke);

export async function copyText(text: string): Promise<void> {
  const native = invoke("copy_text", { text });
  if (native) {
    await native;
    return;
  }
  if (navigator.clipboard?.writeText) {
    try {
      await navigator.clipboard.writeText(text);
      return;
    } catch {
      /* not allowed (plain http, no focus): fall back below */
    }
  }
  const area = document.createElement("textarea");
  area.value = text;
  area.style.position = "fixed";
  area.style.opacity = "0";
  document.body.appendChild(area);
  area.select();
  document.execCommand("copy");
  area.remove();
}

export function openChat() {
  if (!invoke("open_chat")) window.open("#/chat", "_blank");
}

export function openDashboard() {
  if (!invoke("open_dashboard")) window.open("#/models", "_blank");
}

export async function getLaunchAtLogin(): Promise<boolean | null> {
  const native = invoke("get_launch_at_login");
  return native ? Boolean(await native) : null;
}

export async function setLaunchAtLogin(enabled: boolean): Promise<void> {
  await invoke("set_launch_at_login", { enabled });
}

/** What the Server page asks the app for: this Mac's rank of a cluster (`serve --cluster`, run by
 * the app as a child process). */
export interface ClusterPlan {
  machines: string[];
  rank: number;
  model: string;
  parallel: "pipeline" | "tensor";
}

/** This Mac's rank as the app runs it: running, or how it ended; its latest output. */
export interface ClusterChild {
  rank: number;
  machines: string[];
  model: string;
  parallel: string;
  pid: number;
  running: boolean;
  exit: string | null;
  log: string[];
}

/** Null outside the app (a browser has no process to start). */
export async function clusterLaunch(): Promise<ClusterChild | null> {
  const native = invoke("cluster_launch");
  return native ? ((await native) as ClusterChild | null) : null;
}

export async function startCluster(plan: ClusterPlan): Promise<ClusterChild> {
  const native = invoke("start_cluster", { plan });
  if (!native) throw new Error("only the FastMLX app starts a cluster; elsewhere run fastmlx serve --cluster");
  return (await native) as ClusterChild;
}

export async function stopCluster(): Promise<ClusterChild | null> {
  const native = invoke("stop_cluster");
  return native ? ((await native) as ClusterChild | null) : null;
}
