import type { ComponentChildren } from "preact";
import { useState } from "preact/hooks";
import { copyText } from "../native";

export function Spinner({ label }: { label?: string }) {
  return <span class="spinner" role="status" aria-label={label ?? "working"} data-testid="spinner" />;
}

export function ErrorBox({ error, onClose, children }: { error: string | null; onClose?: () => void; children?: ComponentChildren }) {
  if (!error) return null;
  return (
    <div class="error" role="alert" data-testid="error">
      <span class="error-text">{error}</span>
      {children}
      {onClose && (
        <button class="icon" onClick={onClose} aria-label="dismiss">
          ×
        </button>
      )}
    </div>
  );
}

export function CopyButton({ text, testid, label = "Copy" }: { text: string | (() => string); testid?: string; label?: string }) {
  const [copied, setCopied] = useState(false);
  return (
    <button
      class="small"
      data-testid={testid}
      onClick={async () => {
        await copyText(typeof text === "function" ? text() : text);
        setCopied(true);
        setTimeout(() => setCopied(false), 1200);
      }}
    >
      {copied ? "Copied" : label}
    </button>
  );
}

export function Badge({ kind, children, testid }: { kind: string; children: ComponentChildren; testid?: string }) {
  return (
    <span class={`badge badge-${kind}`} data-testid={testid}>
      {children}
    </span>
  );
}
