// What the chat window sends (an OpenAI chat-completions request built from a conversation) and
// how it reads the streamed answer back (content, reasoning and tool calls, chunk by chunk).
import type { Conversation, Message, ToolCall } from "./chats";

export interface Chunk {
  choices?: {
    delta?: {
      content?: string | null;
      reasoning_content?: string | null;
      tool_calls?: { index: number; id?: string; function?: { name?: string; arguments?: string } }[];
    };
    finish_reason?: string | null;
  }[];
  usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number } | null;
  error?: { message: string };
}

/** A conversation's temperature until it sets one (as typed in its field). */
export const DEFAULT_TEMPERATURE = "0.7";

/** A conversation's tools as typed: the `tools` to send, or why they cannot be. Empty text: none. */
export function parseTools(text: string | undefined): { tools: unknown[] | null; error: string | null } {
  if (!text?.trim()) return { tools: null, error: null };
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    return { tools: null, error: `not JSON: ${(e as Error).message}` };
  }
  const list = Array.isArray(value) ? value : [value];
  const tools: unknown[] = [];
  for (const [i, item] of list.entries()) {
    if (!item || typeof item !== "object") return { tools: null, error: `tool ${i + 1} is not an object` };
    // A bare function ({name, parameters}) is taken as the OpenAI tool wrapping it.
    const tool = "function" in item ? item : { type: "function", function: item };
    const name = (tool as { function?: { name?: unknown } }).function?.name;
    if (typeof name !== "string" || !name) return { tools: null, error: `tool ${i + 1} has no function name` };
    tools.push(tool);
  }
  return { tools: tools.length ? tools : null, error: null };
}

/** A message as the API takes it: tool calls and their results in OpenAI's shape. */
function apiMessage(m: Message): Record<string, unknown> {
  if (m.role === "tool") return { role: "tool", tool_call_id: m.toolCallId, content: m.content };
  if (m.role === "assistant" && m.toolCalls?.length) {
    return {
      role: "assistant",
      content: m.content || null,
      tool_calls: m.toolCalls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } })),
    };
  }
  if (m.role === "user" && m.images?.length) {
    // Images first, as the vision models' own chat examples put them.
    const images = m.images.map((url) => ({ type: "image_url", image_url: { url } }));
    return { role: "user", content: [...images, ...(m.content ? [{ type: "text", text: m.content }] : [])] };
  }
  return { role: m.role, content: m.content };
}

/** The request for an answer to `history` in `conv` (its model, system prompt and settings). */
export function chatBody(conv: Conversation, model: string, history: Message[]): Record<string, unknown> {
  const kept = history.filter((m) => !m.error && (m.content || m.role !== "assistant" || m.toolCalls?.length));
  const messages = [...(conv.system.trim() ? [{ role: "system", content: conv.system }] : []), ...kept.map(apiMessage)];
  const body: Record<string, unknown> = { model, messages, stream: true, stream_options: { include_usage: true } };
  const temp = parseFloat(conv.temperature ?? DEFAULT_TEMPERATURE);
  if (Number.isFinite(temp)) body.temperature = temp;
  const max = parseInt(conv.maxTokens ?? "", 10);
  if (Number.isFinite(max) && max > 0) body.max_tokens = max;
  const { tools } = parseTools(conv.tools);
  if (tools) {
    body.tools = tools;
    if (conv.forceTool) body.tool_choice = "required";
  }
  return body;
}

/** An answer as it streams in. */
export class Reply {
  content = "";
  reasoning = "";
  toolCalls: ToolCall[] = [];
  finish: string | null = null;
  usage: Chunk["usage"] = null;

  /** Takes one chunk; true when it carried text or a call (a token's worth for the stats). */
  add(chunk: Chunk): boolean {
    if (chunk.error) throw new Error(chunk.error.message);
    if (chunk.usage) this.usage = chunk.usage;
    const choice = chunk.choices?.[0];
    if (!choice) return false;
    if (choice.finish_reason) this.finish = choice.finish_reason;
    const delta = choice.delta ?? {};
    this.content += delta.content ?? "";
    this.reasoning += delta.reasoning_content ?? "";
    for (const part of delta.tool_calls ?? []) {
      const call = (this.toolCalls[part.index] ??= { id: "", name: "", arguments: "" });
      call.id ||= part.id ?? "";
      call.name += part.function?.name ?? "";
      call.arguments += part.function?.arguments ?? "";
    }
    return Boolean(delta.content || delta.reasoning_content || delta.tool_calls?.length);
  }

  /** The assistant message's fields so far. */
  fields(): Partial<Message> {
    return {
      content: this.content,
      reasoning: this.reasoning || undefined,
      toolCalls: this.toolCalls.length ? this.toolCalls.map((c) => ({ ...c })) : undefined,
    };
  }
}
