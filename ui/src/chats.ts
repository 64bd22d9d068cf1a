// Conversations, kept in localStorage so they survive restarts of the app.

export interface ReplyStats {
  prompt_tokens?: number;
  completion_tokens: number;
  /** Completion tokens over the time from the first token to the last. */
  tokens_per_sec: number | null;
  ttft_ms: number | null;
  finish_reason?: string | null;
  /** Stopped by the user: the count is of streamed chunks, not the server's usage. */
  stopped?: boolean;
}

export interface Message {
  role: "user" | "assistant";
  content: string;
  reasoning?: string;
  model?: string;
  stats?: ReplyStats;
  error?: string;
}

export interface Conversation {
  id: string;
  title: string;
  model: string;
  system: string;
  messages: Message[];
  updated: number;
}

const LIST = "fastmlx.chats";
const CURRENT = "fastmlx.chat.current";
const MODEL = "fastmlx.chat.model";

export function loadChats(): Conversation[] {
  try {
    const list = JSON.parse(localStorage.getItem(LIST) ?? "[]");
    return Array.isArray(list) ? list : [];
  } catch {
    return [];
  }
}

export function saveChats(list: Conversation[]) {
  // Empty conversations are not worth keeping.
  const kept = list.filter((c) => c.messages.length > 0);
  try {
    localStorage.setItem(LIST, JSON.stringify(kept));
  } catch {
    // full: drop the oldest half and try once more
    const recent = [...kept].sort((a, b) => b.updated - a.updated).slice(0, Math.ceil(kept.length / 2));
    localStorage.setItem(LIST, JSON.stringify(recent));
  }
}

export function currentId(): string | null {
  return localStorage.getItem(CURRENT);
}

export function setCurrentId(id: string) {
  localStorage.setItem(CURRENT, id);
}

export function lastModel(): string {
  return localStorage.getItem(MODEL) ?? "";
}

export function setLastModel(id: string) {
  localStorage.setItem(MODEL, id);
}

export function newConversation(model: string, system = ""): Conversation {
  const id = typeof crypto.randomUUID === "function" ? crypto.randomUUID() : `${Date.now()}-${Math.random()}`;
  return { id, title: "New chat", model, system, messages: [], updated: Date.now() };
}

export function titleOf(text: string): string {
  const line = text.trim().split("\n")[0];
  return line.length > 48 ? `${line.slice(0, 47)}…` : line || "New chat";
}
