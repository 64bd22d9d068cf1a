import { useEffect, useRef, useState } from "preact/hooks";
import { getJson, isDesktop, request, readEvents, type ServerStatus } from "../api";
import { copyText, openDashboard } from "../native";
import { ErrorBox, Spinner } from "../components/common";
import { Markdown } from "../components/Markdown";
import { ToolCallCards, ToolResult, ToolResultsForm, ToolsEditor } from "../components/ToolCalls";
import { chatBody, DEFAULT_TEMPERATURE, parseTools, Reply } from "../chatRequest";
import {
  currentId,
  lastModel,
  loadChats,
  matches,
  newConversation,
  saveChats,
  setCurrentId,
  setLastModel,
  titleOf,
  toMarkdown,
  type Conversation,
  type Message,
  type ReplyStats,
} from "../chats";
import { ms, rate } from "../format";
import { IMAGE_TYPES, imageFiles, readImages } from "../attachments";

interface ModelOption {
  id: string;
  loaded: boolean;
  /** It reads images. */
  vision: boolean;
}

function initialState(): { chats: Conversation[]; current: string } {
  const chats = loadChats();
  const saved = currentId();
  if (saved && chats.some((c) => c.id === saved)) return { chats, current: saved };
  const fresh = newConversation(lastModel());
  return { chats: [fresh, ...chats], current: fresh.id };
}

export function ChatPage() {
  const [{ chats, current }, setState] = useState(initialState);
  const [models, setModels] = useState<ModelOption[] | null>(null);
  const [input, setInput] = useState("");
  /** Images attached to the message being written (data URLs), and files refused. */
  const [attached, setAttached] = useState<string[]>([]);
  const [attachError, setAttachError] = useState<string | null>(null);
  const [dragging, setDragging] = useState(false);
  const filePicker = useRef<HTMLInputElement>(null);
  const [error, setError] = useState<string | null>(null);
  const [streaming, setStreaming] = useState<string | null>(null);
  const [showSystem, setShowSystem] = useState(false);
  const [showTools, setShowTools] = useState(false);
  const [search, setSearch] = useState("");
  /** The user message being edited: its index and the new text. */
  const [editing, setEditing] = useState<{ at: number; text: string } | null>(null);
  const [exported, setExported] = useState(false);
  const abort = useRef<AbortController | null>(null);
  const list = useRef<HTMLDivElement>(null);
  const stick = useRef(true);
  const inputBox = useRef<HTMLTextAreaElement>(null);

  const conv = chats.find((c) => c.id === current) ?? chats[0];
  const temperature = conv?.temperature ?? DEFAULT_TEMPERATURE;
  const maxTokens = conv?.maxTokens ?? "";

  // The model list: loaded ones first.
  useEffect(() => {
    Promise.all([
      getJson<{ data: { id: string; kind?: string; vision?: boolean }[] }>("/v1/models"),
      getJson<ServerStatus>("/admin/status").catch(() => null),
    ])
      .then(([all, status]) => {
        const loaded = new Set((status?.loaded ?? []).map((m) => m.id));
        // Embedding models and rerankers do not chat.
        const chat = all.data.filter((m) => (m.kind ?? "chat") === "chat");
        const options = chat.map((m) => ({ id: m.id, loaded: loaded.has(m.id), vision: Boolean(m.vision) }));
        options.sort((a, b) => Number(b.loaded) - Number(a.loaded));
        setModels(options);
      })
      .catch((e) => setError(e.message));
  }, []);

  // A conversation without a usable model gets the last one used, else the first loaded one.
  useEffect(() => {
    if (!models || !conv || models.some((m) => m.id === conv.model)) return;
    const pick = models.find((m) => m.id === lastModel()) ?? models[0];
    if (pick) update(conv.id, (c) => ({ ...c, model: pick.id }));
  }, [models, conv?.id]);

  // Saved shortly after every change (and at once when a reply ends).
  useEffect(() => {
    const timer = setTimeout(() => saveChats(chats), streaming ? 1000 : 100);
    return () => clearTimeout(timer);
  }, [chats, streaming]);

  useEffect(() => {
    setCurrentId(current);
    stick.current = true;
    inputBox.current?.focus();
  }, [current]);

  // Follow the end of the list while a reply streams, unless the reader scrolled up.
  useEffect(() => {
    const el = list.current;
    if (el && stick.current) el.scrollTop = el.scrollHeight;
  });

  function update(id: string, fn: (c: Conversation) => Conversation) {
    setState((s) => ({ ...s, chats: s.chats.map((c) => (c.id === id ? fn(c) : c)) }));
  }

  function updateLast(id: string, fn: (m: Message) => Message) {
    update(id, (c) => ({ ...c, messages: c.messages.map((m, i) => (i === c.messages.length - 1 ? fn(m) : m)) }));
  }

  function startNew() {
    setState((s) => {
      const empty = s.chats.find((c) => c.messages.length === 0);
      if (empty) return { ...s, current: empty.id };
      const fresh = newConversation(conv?.model || lastModel(), conv?.system ?? "");
      return { chats: [fresh, ...s.chats], current: fresh.id };
    });
    setInput("");
  }

  function remove(id: string) {
    setState((s) => {
      const rest = s.chats.filter((c) => c.id !== id);
      if (s.current !== id) return { ...s, chats: rest };
      const next = rest[0] ?? newConversation(lastModel());
      return { chats: rest.length ? rest : [next], current: next.id };
    });
  }

  function send() {
    const text = input.trim();
    if ((!text && !attached.length) || streaming || !conv) return;
    const message: Message = { role: "user", content: text, ...(attached.length ? { images: attached } : {}) };
    if (generate([...conv.messages, message])) {
      setInput("");
      setAttached([]);
      setAttachError(null);
    }
  }

  /** Picked, pasted or dropped files: the images join the message being written. */
  async function attach(files: File[]) {
    const { images, refused } = await readImages(files, attached.length);
    setAttached((a) => [...a, ...images]);
    setAttachError(refused.length ? refused.join("; ") : null);
  }

  /** The last answer again, from the same history. */
  function regenerate() {
    if (!conv || streaming) return;
    const at = conv.messages.length - 1;
    if (at < 1 || conv.messages[at].role !== "assistant") return;
    generate(conv.messages.slice(0, at));
  }

  /** A sent message changed: the conversation goes on from it, what followed it dropped. */
  function resendEdited() {
    if (!conv || !editing || streaming || !editing.text.trim()) return;
    const images = conv.messages[editing.at]?.images;
    const edited: Message = { role: "user", content: editing.text.trim(), ...(images?.length ? { images } : {}) };
    if (generate([...conv.messages.slice(0, editing.at), edited])) setEditing(null);
  }

  function exportMarkdown() {
    if (!conv) return;
    const text = toMarkdown(conv);
    copyText(text);
    setExported(true);
    setTimeout(() => setExported(false), 1200);
  }

  function downloadMarkdown() {
    if (!conv) return;
    const url = URL.createObjectURL(new Blob([toMarkdown(conv)], { type: "text/markdown" }));
    const a = document.createElement("a");
    a.href = url;
    a.download = `${conv.title.replace(/[^\w\- ]+/g, "").trim() || "chat"}.md`;
    a.click();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  /** Streams an answer to `history` (ending with the user's message) into the current conversation. */
  function generate(history: Message[]): boolean {
    if (!conv) return false;
    if (!conv.model) {
      setError("Choose a model first.");
      return false;
    }
    setError(null);
    stick.current = true;
    const id = conv.id;
    const model = conv.model;
    const first = history.find((m) => m.role === "user");
    update(id, (c) => ({
      ...c,
      title: c.messages.length === 0 && first ? titleOf(first.content || "Image") : c.title,
      updated: Date.now(),
      messages: [...history, { role: "assistant", content: "", model }],
    }));
    stream(id, model, history);
    return true;
  }

  async function stream(id: string, model: string, history: Message[]) {

    const body = chatBody(conv, model, history);

    const controller = new AbortController();
    abort.current = controller;
    setStreaming(id);
    const started = performance.now();
    let first: number | null = null;
    let chunks = 0;
    const reply = new Reply();
    try {
      const res = await request("/v1/chat/completions", { method: "POST", json: body, signal: controller.signal });
      await readEvents(res, (data) => {
        let chunk;
        try {
          chunk = JSON.parse(data);
        } catch {
          return;
        }
        if (reply.add(chunk)) {
          first ??= performance.now();
          chunks++;
          const fields = reply.fields();
          updateLast(id, (m) => ({ ...m, ...fields }));
        }
      });
      const end = performance.now();
      const usage = reply.usage;
      const tokens = usage ? usage.completion_tokens : chunks;
      // From the first chunk on: the decode speed, TTFT apart. An answer that came in one chunk
      // (a tool call is sent whole once parsed) is timed from the request.
      // (Set in the callback: TypeScript's narrowing cannot see it.)
      const firstAt = first as number | null;
      const fromFirst = firstAt != null && chunks > 1 && end - firstAt > 0 && tokens > 1;
      const secs = fromFirst && firstAt != null ? (end - firstAt) / 1000 : (end - started) / 1000;
      const stats: ReplyStats = {
        prompt_tokens: usage?.prompt_tokens,
        completion_tokens: tokens,
        tokens_per_sec: secs > 0 ? (fromFirst ? tokens - 1 : tokens) / secs : null,
        ttft_ms: firstAt != null ? firstAt - started : null,
        finish_reason: reply.finish,
      };
      updateLast(id, (m) => ({ ...m, stats }));
    } catch (e) {
      const end = performance.now();
      if ((e as Error).name === "AbortError") {
        const secs = first != null ? (end - first) / 1000 : 0;
        updateLast(id, (m) => ({
          ...m,
          stats: {
            completion_tokens: chunks,
            tokens_per_sec: secs > 0 && chunks > 1 ? (chunks - 1) / secs : null,
            ttft_ms: first != null ? first - started : null,
            stopped: true,
          },
        }));
      } else {
        updateLast(id, (m) => ({ ...m, error: (e as Error).message }));
      }
    } finally {
      abort.current = null;
      setStreaming(null);
      update(id, (c) => ({ ...c, updated: Date.now() }));
    }
  }

  function stop() {
    abort.current?.abort();
  }

  const sorted = [...chats].sort((a, b) => b.updated - a.updated);
  const { tools: offered, error: toolsError } = parseTools(conv?.tools);
  const toolCount = offered?.length ?? 0;
  const busyHere = streaming === conv?.id;

  return (
    <div class="chat">
      <aside class="chat-side">
        <button class="primary" onClick={startNew} data-testid="chat-new">
          + New chat
        </button>
        <input
          type="search"
          class="chat-search"
          placeholder="Search chats"
          value={search}
          onInput={(e) => setSearch((e.target as HTMLInputElement).value)}
          data-testid="chat-search"
        />
        <ul class="conversations" data-testid="conversation-list">
          {sorted
            .filter((c) => (c.messages.length > 0 || c.id === current) && matches(c, search))
            .map((c) => (
              <li
                key={c.id}
                class={c.id === current ? "active" : ""}
                data-testid="conversation-item"
                data-id={c.id}
                onClick={() => setState((s) => ({ ...s, current: c.id }))}
              >
                <span class="title">{c.title}</span>
                {c.messages.length > 0 && (
                  <button
                    class="icon"
                    title="Delete conversation"
                    onClick={(e) => {
                      e.stopPropagation();
                      if (window.confirm(`Delete "${c.title}"?`)) remove(c.id);
                    }}
                    data-testid="conversation-delete"
                  >
                    ×
                  </button>
                )}
              </li>
            ))}
        </ul>
      </aside>
      <div class="chat-main">
        <div class="chat-head">
          <select
            value={conv?.model ?? ""}
            onChange={(e) => {
              const model = (e.target as HTMLSelectElement).value;
              setLastModel(model);
              update(conv.id, (c) => ({ ...c, model }));
            }}
            data-testid="chat-model"
            aria-label="Model"
          >
            {!models && <option value={conv?.model ?? ""}>{conv?.model || "loading models…"}</option>}
            {models?.length === 0 && <option value="">no models</option>}
            {models?.map((m) => (
              <option key={m.id} value={m.id}>
                {m.id}
                {m.loaded ? " (loaded)" : ""}
              </option>
            ))}
          </select>
          <button class={`small ${showSystem || conv?.system ? "on" : ""}`} onClick={() => setShowSystem(!showSystem)} data-testid="chat-system-toggle">
            System prompt
          </button>
          <button
            class={`small ${showTools || conv?.tools?.trim() ? "on" : ""}`}
            onClick={() => setShowTools(!showTools)}
            title="Functions the model may call"
            data-testid="chat-tools-toggle"
          >
            Tools{toolCount ? ` (${toolCount})` : ""}
          </button>
          <label class="inline small-text">
            temp
            <input type="number" min="0" max="2" step="0.1" value={temperature} onInput={(e) => update(conv.id, (c) => ({ ...c, temperature: (e.target as HTMLInputElement).value }))} data-testid="chat-temperature" />
          </label>
          <label class="inline small-text">
            max tokens
            <input type="number" min="1" step="1" placeholder="auto" value={maxTokens} onInput={(e) => update(conv.id, (c) => ({ ...c, maxTokens: (e.target as HTMLInputElement).value }))} data-testid="chat-max-tokens" />
          </label>
          {conv && conv.messages.length > 0 && (
            <>
              <button class="small" onClick={exportMarkdown} title="Copy the conversation as Markdown" data-testid="chat-export">
                {exported ? "Copied" : "Copy as Markdown"}
              </button>
              {!isDesktop && (
                <button class="small" onClick={downloadMarkdown} title="Save the conversation as a Markdown file" data-testid="chat-download">
                  Download
                </button>
              )}
            </>
          )}
          {isDesktop && (
            <button class="small dashboard-link" onClick={() => openDashboard()} data-testid="open-dashboard">
              Dashboard
            </button>
          )}
        </div>
        {(showSystem || conv?.system) && (
          <textarea
            class="system"
            rows={2}
            placeholder="System prompt (optional): how the assistant should behave"
            value={conv?.system ?? ""}
            onInput={(e) => update(conv.id, (c) => ({ ...c, system: (e.target as HTMLTextAreaElement).value }))}
            data-testid="chat-system"
          />
        )}
        {conv && (showTools || toolsError) && (
          <ToolsEditor
            text={conv.tools ?? ""}
            force={conv.forceTool ?? false}
            onText={(tools) => update(conv.id, (c) => ({ ...c, tools }))}
            onForce={(forceTool) => update(conv.id, (c) => ({ ...c, forceTool }))}
          />
        )}
        <ErrorBox error={error} onClose={() => setError(null)} />
        <div
          class="messages"
          ref={list}
          data-testid="messages"
          onScroll={(e) => {
            const el = e.currentTarget as HTMLDivElement;
            stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
          }}
        >
          {conv?.messages.length === 0 && <div class="empty muted">Ask anything. Enter sends, Shift+Enter adds a line.</div>}
          {conv?.messages.map((m, i) => {
            const last = i === conv.messages.length - 1;
            const live = busyHere && last && m.role === "assistant";
            return (
              <div key={i} class={`message ${m.role}`} data-testid="message" data-role={m.role} data-streaming={String(live)}>
                {m.reasoning && (
                  <details class="reasoning" data-testid="reasoning" open={live && !m.content}>
                    <summary>Reasoning</summary>
                    <div class="reasoning-text">{m.reasoning}</div>
                  </details>
                )}
                {m.role === "tool" ? (
                  <ToolResult message={m} />
                ) : m.role === "assistant" ? (
                  <>
                    {(m.content || !m.toolCalls?.length) && <Markdown text={m.content} testid="message-content" />}
                    {m.toolCalls?.length ? <ToolCallCards calls={m.toolCalls} /> : null}
                  </>
                ) : editing?.at === i ? (
                  <div class="edit">
                    <textarea
                      rows={3}
                      value={editing.text}
                      onInput={(e) => setEditing({ at: i, text: (e.target as HTMLTextAreaElement).value })}
                      data-testid="edit-input"
                    />
                    <button class="small primary" onClick={resendEdited} disabled={streaming !== null} data-testid="edit-send">
                      Send
                    </button>
                    <button class="small" onClick={() => setEditing(null)}>
                      Cancel
                    </button>
                  </div>
                ) : (
                  <>
                    {m.images?.length ? (
                      <div class="message-images">
                        {m.images.map((url, k) => (
                          <a key={k} href={url} target="_blank" rel="noreferrer">
                            <img src={url} alt={`image ${k + 1}`} data-testid="message-image" />
                          </a>
                        ))}
                      </div>
                    ) : null}
                    {m.imagesDropped ? (
                      <div class="muted small-text" data-testid="message-images-dropped">
                        {m.imagesDropped} image{m.imagesDropped === 1 ? "" : "s"} not kept (storage full)
                      </div>
                    ) : null}
                    {m.content && (
                      <div class="plain" data-testid="message-content">
                        {m.content}
                      </div>
                    )}
                  </>
                )}
                {m.role === "user" && editing?.at !== i && streaming === null && (
                  <button class="link small-text msg-action" onClick={() => setEditing({ at: i, text: m.content })} data-testid="edit">
                    Edit
                  </button>
                )}
                {live && !m.content && !m.reasoning && !m.toolCalls && <Spinner label="waiting for the first token" />}
                {m.error && (
                  <div class="error-text" data-testid="message-error">
                    {m.error}
                  </div>
                )}
                {m.stats && (
                  <div class="stats muted small-text" data-testid="reply-stats" data-tokens={m.stats.completion_tokens}>
                    {m.stats.stopped ? "stopped · ~" : ""}
                    {m.stats.completion_tokens} tokens · {rate(m.stats.tokens_per_sec)} · first token {ms(m.stats.ttft_ms)}
                    {m.stats.finish_reason === "length" && " · cut at max tokens"}
                    {m.model && ` · ${m.model}`}
                  </div>
                )}
                {last && m.role === "assistant" && streaming === null && m.toolCalls?.length ? (
                  <ToolResultsForm
                    key={`${conv.id}-${i}`}
                    calls={m.toolCalls}
                    disabled={streaming !== null}
                    onSend={(results) => generate([...conv.messages, ...results])}
                  />
                ) : null}
                {last && m.role === "assistant" && streaming === null && (
                  <button class="link small-text msg-action" onClick={regenerate} data-testid="regenerate">
                    Regenerate
                  </button>
                )}
              </div>
            );
          })}
        </div>
        {attached.length || attachError ? (
          <div class="attachments" data-testid="attachments">
            {attached.map((url, k) => (
              <div class="attachment" key={k} data-testid="attachment">
                <img src={url} alt={`attached image ${k + 1}`} />
                <button
                  type="button"
                  class="link"
                  title="Remove"
                  onClick={() => setAttached((a) => a.filter((_, j) => j !== k))}
                  data-testid="attachment-remove"
                >
                  ×
                </button>
              </div>
            ))}
            {attached.length > 0 && models?.some((m) => m.id === conv?.model && !m.vision) && (
              <div class="muted small-text" data-testid="attach-text-only">
                {conv?.model} reads text only: choose a model that sees images (Qwen3-VL, Qwen3.5) to send these.
              </div>
            )}
            {attachError && (
              <div class="error-text small-text" data-testid="attach-error">
                {attachError}
              </div>
            )}
          </div>
        ) : null}
        <form
          class={`composer${dragging ? " dragging" : ""}`}
          onSubmit={(e) => {
            e.preventDefault();
            send();
          }}
          onDragOver={(e) => {
            if (!e.dataTransfer?.types.includes("Files")) return;
            e.preventDefault();
            setDragging(true);
          }}
          onDragLeave={() => setDragging(false)}
          onDrop={(e) => {
            e.preventDefault();
            setDragging(false);
            attach(imageFiles(e.dataTransfer));
          }}
          data-testid="composer"
        >
          <input
            ref={filePicker}
            type="file"
            accept={IMAGE_TYPES.join(",")}
            multiple
            hidden
            onChange={(e) => {
              const input = e.target as HTMLInputElement;
              attach(Array.from(input.files ?? []));
              input.value = "";
            }}
            data-testid="chat-attach-input"
          />
          <button type="button" class="attach" title="Attach images (or paste or drop them)" onClick={() => filePicker.current?.click()} data-testid="chat-attach">
            Image
          </button>
          <textarea
            ref={inputBox}
            rows={2}
            placeholder="Message"
            value={input}
            onInput={(e) => setInput((e.target as HTMLTextAreaElement).value)}
            onPaste={(e) => {
              const files = imageFiles(e.clipboardData);
              if (!files.length) return;
              e.preventDefault();
              attach(files);
            }}
            onKeyDown={(e) => {
              if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
                e.preventDefault();
                send();
              }
            }}
            data-testid="chat-input"
          />
          {busyHere ? (
            <button type="button" class="danger" onClick={stop} data-testid="chat-stop">
              Stop
            </button>
          ) : (
            <button type="submit" class="primary" disabled={(!input.trim() && !attached.length) || streaming !== null} data-testid="chat-send">
              Send
            </button>
          )}
        </form>
      </div>
    </div>
  );
}
