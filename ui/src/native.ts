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
