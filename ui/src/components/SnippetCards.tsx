import type { Snippet } from "../snippets";
import { CopyButton } from "./common";

/** Client configurations as cards, each with a copy button (the Server page, a model's page). */
export function SnippetCards({ snippets, testid, copyTestid }: { snippets: Snippet[]; testid: string; copyTestid?: string }) {
  return (
    <div class="snippets">
      {snippets.map((s) => (
        <div class="snippet card" key={s.id} data-testid={`${testid}-${s.id}`}>
          <div class="snippet-head">
            <b>{s.name}</b>
            <span class="muted small-text">{s.where}</span>
            <CopyButton text={s.text} testid={copyTestid && `${copyTestid}-${s.id}`} />
          </div>
          <pre>
            <code>{s.text}</code>
          </pre>
        </div>
      ))}
    </div>
  );
}
