// Tool calls in the chat: the functions a conversation offers the model (typed as JSON), the calls
// the model makes (shown as cards), and the results the person types back for it to go on.
import { useState } from "preact/hooks";
import { parseTools } from "../chatRequest";
import type { Message, ToolCall } from "../chats";

const EXAMPLE = JSON.stringify(
  [
    {
      type: "function",
      function: {
        name: "get_weather",
        description: "The current weather in a city",
        parameters: {
          type: "object",
          properties: { city: { type: "string" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } },
          required: ["city"],
        },
      },
    },
  ],
  null,
  2,
);

/** The conversation's tools: a JSON editor, checked as typed, and whether a call is required. */
export function ToolsEditor({
  text,
  force,
  onText,
  onForce,
}: {
  text: string;
  force: boolean;
  onText: (t: string) => void;
  onForce: (f: boolean) => void;
}) {
  const { tools, error } = parseTools(text);
  return (
    <div class="tools-editor" data-testid="chat-tools">
      <textarea
        rows={6}
        spellcheck={false}
        placeholder='Functions the model may call: an OpenAI "tools" array in JSON'
        value={text}
        onInput={(e) => onText((e.target as HTMLTextAreaElement).value)}
        data-testid="chat-tools-input"
      />
      <div class="tools-status small-text">
        {error ? (
          <span class="error-text" data-testid="chat-tools-error">
            Not sent: {error}
          </span>
        ) : (
          <span class="muted" data-testid="chat-tools-count">
            {tools ? `${tools.length} tool${tools.length > 1 ? "s" : ""} offered` : "no tools"}
          </span>
        )}
        <label class="inline tools-force">
          <input type="checkbox" checked={force} onChange={(e) => onForce((e.target as HTMLInputElement).checked)} data-testid="chat-tools-force" />
          the model must call one
        </label>
        {!text.trim() && (
          <button class="link small-text" onClick={() => onText(EXAMPLE)} data-testid="chat-tools-example">
            Insert an example
          </button>
        )}
      </div>
    </div>
  );
}

function pretty(args: string): string {
  try {
    return JSON.stringify(JSON.parse(args), null, 2);
  } catch {
    return args;
  }
}

/** The calls of one answer, each folded open to its arguments. */
export function ToolCallCards({ calls }: { calls: ToolCall[] }) {
  return (
    <div class="tool-calls">
      {calls.map((call, i) => (
        <details class="tool-call" open key={call.id || i} data-testid="tool-call" data-name={call.name}>
          <summary>
            Call <code>{call.name || "…"}</code>
          </summary>
          <pre data-testid="tool-call-arguments">{pretty(call.arguments)}</pre>
        </details>
      ))}
    </div>
  );
}

/** A tool's result in the conversation. */
export function ToolResult({ message }: { message: Message }) {
  return (
    <details class="tool-result" open data-testid="tool-result">
      <summary>
        Result of <code>{message.name ?? "?"}</code>
      </summary>
      <pre>{message.content}</pre>
    </details>
  );
}

/** What the functions returned, typed by the person, sent back for the model to go on. */
export function ToolResultsForm({ calls, disabled, onSend }: { calls: ToolCall[]; disabled: boolean; onSend: (results: Message[]) => void }) {
  const [values, setValues] = useState<string[]>(() => calls.map(() => ""));
  const send = () =>
    onSend(calls.map((call, i) => ({ role: "tool", content: values[i] ?? "", toolCallId: call.id, name: call.name })));
  return (
    <form
      class="tool-results"
      data-testid="tool-results"
      onSubmit={(e) => {
        e.preventDefault();
        send();
      }}
    >
      {calls.map((call, i) => (
        <label key={call.id || i} class="small-text">
          <span>
            What <code>{call.name}</code> returned
          </span>
          <textarea
            rows={2}
            value={values[i] ?? ""}
            placeholder='e.g. {"temperature": 21}'
            onInput={(e) => setValues((v) => v.map((x, j) => (j === i ? (e.target as HTMLTextAreaElement).value : x)))}
            data-testid="tool-result-input"
          />
        </label>
      ))}
      <button type="submit" class="small primary" disabled={disabled} data-testid="tool-results-send">
        Send {calls.length > 1 ? "results" : "result"}
      </button>
    </form>
  );
}
