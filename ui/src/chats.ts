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

/** A function call the model asked for (its arguments as the model wrote them: JSON text). */
export interface ToolCall {
  id: string;
  name: string;
  arguments: string;
}

export interface Message {
  role: "user" | "assistant" | "tool";
  content: string;
  /** User messages: attached images, as data URLs. */
  images?: string[];
  /** Images not kept when storage was full (their count). */
  imagesDropped?: number;
  reasoning?: string;
  /** Assistant messages: the calls the model made. */
  toolCalls?: ToolCall[];
  /** Tool messages: the call answered, and its function's name. */
  toolCallId?: string;
  name?: string;
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
  /** This conversation's sampling (as typed; empty: the server's default). */
  temperature?: string;
  maxTokens?: string;
  /** Functions the model may call, as typed (an OpenAI `tools` array in JSON), and whether it must. */
  tools?: string;
  forceTool?: boolean;
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
  const attempts = [
    kept,
    // full: drop the oldest half...
    [...kept].sort((a, b) => b.updated - a.updated).slice(0, Math.ceil(kept.length / 2)),
    // ...then the images, which take most of the room (their count stays).
    kept.map(withoutImages),
  ];
  for (const attempt of attempts) {
    try {
      localStorage.setItem(LIST, JSON.stringify(attempt));
      return;
    } catch {
      // try the next, smaller form
    }
  }
}

function withoutImages(c: Conversation): Conversation {
  return {
    ...c,
    messages: c.messages.map(({ images, ...m }) =>
      images?.length ? { ...m, imagesDropped: (m.imagesDropped ?? 0) + images.length } : m,
    ),
  };
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

/** Whether a conversation's title or any of its messages contains `query` (any case). */
export function matches(c: Conversation, query: string): boolean {
  const q = query.trim().toLowerCase();
  if (!q) return true;
  return c.title.toLowerCase().includes(q) || c.messages.some((m) => m.content.toLowerCase().includes(q));
}

/** The conversation as Markdown: its system prompt, then each turn under its speaker. */
export function toMarkdown(c: Conversation): string {
  const parts = [`# ${c.title}`, `_${c.model || "no model"} · ${new Date(c.updated).toISOString().slice(0, 16).replace("T", " ")}_`];
  if (c.system.trim()) parts.push(`**System prompt:** ${c.system.trim()}`);
  for (const m of c.messages) {
    const speaker = { user: "## You", assistant: `## Assistant${m.model ? ` (${m.model})` : ""}`, tool: `## Tool result (${m.name ?? "?"})` };
    parts.push(speaker[m.role]);
    if (m.reasoning) parts.push(`<details><summary>Reasoning</summary>\n\n${m.reasoning}\n\n</details>`);
    const images = (m.images?.length ?? 0) + (m.imagesDropped ?? 0);
    if (images) parts.push(`_${images} image${images === 1 ? "" : "s"} attached_`);
    if (m.content) parts.push(m.role === "tool" ? "```\n" + m.content + "\n```" : m.content);
    for (const call of m.toolCalls ?? []) parts.push(`**Call** \`${call.name}\`\n\n\`\`\`json\n${call.arguments}\n\`\`\``);
    if (m.error) parts.push(`> Error: ${m.error}`);
  }
  return parts.join("\n\n") + "\n";
}
