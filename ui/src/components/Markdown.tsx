// The model's text as markdown, sanitized (the model may write any HTML), with code blocks
// highlighted and a copy button on each, and links opening outside the app.
import DOMPurify from "dompurify";
import { marked } from "marked";
import { useLayoutEffect, useMemo, useRef } from "preact/hooks";
import { highlightCode } from "../highlight";
import { copyText } from "../native";

marked.setOptions({ gfm: true, breaks: true });

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

export function renderMarkdown(text: string): string {
  return DOMPurify.sanitize(marked.parse(text, { async: false }) as string);
}

export function Markdown({ text, testid }: { text: string; testid?: string }) {
  const html = useMemo(() => renderMarkdown(text), [text]);
  const box = useRef<HTMLDivElement>(null);

  useLayoutEffect(() => {
    if (box.current) highlightCode(box.current);
    for (const pre of box.current?.querySelectorAll("pre") ?? []) {
      if (pre.querySelector(":scope > button.code-copy")) continue;
      const button = document.createElement("button");
      button.className = "code-copy small";
      button.type = "button";
      button.textContent = "Copy";
      button.dataset.testid = "code-copy";
      pre.prepend(button);
    }
  }, [html]);

  const onClick = async (e: MouseEvent) => {
    const button = (e.target as HTMLElement).closest("button.code-copy") as HTMLButtonElement | null;
    if (!button) return;
    const code = button.parentElement?.querySelector("code");
    await copyText(code?.textContent ?? "");
    button.textContent = "Copied";
    setTimeout(() => (button.textContent = "Copy"), 1200);
  };

  return <div class="md" ref={box} onClick={onClick} data-testid={testid} dangerouslySetInnerHTML={{ __html: html }} />;
}
