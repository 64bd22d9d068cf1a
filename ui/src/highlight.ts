// Code highlighting for the chat's code blocks: highlight.js's core with the languages people ask
// models about (registered one by one: the full bundle is ten times the size), matched to the
// fence's language; a block without one is guessed among these only.
import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import c from "highlight.js/lib/languages/c";
import cpp from "highlight.js/lib/languages/cpp";
import csharp from "highlight.js/lib/languages/csharp";
import css from "highlight.js/lib/languages/css";
import diff from "highlight.js/lib/languages/diff";
import dockerfile from "highlight.js/lib/languages/dockerfile";
import go from "highlight.js/lib/languages/go";
import ini from "highlight.js/lib/languages/ini";
import java from "highlight.js/lib/languages/java";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import kotlin from "highlight.js/lib/languages/kotlin";
import markdown from "highlight.js/lib/languages/markdown";
import php from "highlight.js/lib/languages/php";
import python from "highlight.js/lib/languages/python";
import ruby from "highlight.js/lib/languages/ruby";
import rust from "highlight.js/lib/languages/rust";
import shell from "highlight.js/lib/languages/shell";
import sql from "highlight.js/lib/languages/sql";
import swift from "highlight.js/lib/languages/swift";
import typescript from "highlight.js/lib/languages/typescript";
import xml from "highlight.js/lib/languages/xml";
import yaml from "highlight.js/lib/languages/yaml";

const languages = {
  bash, c, cpp, csharp, css, diff, dockerfile, go, ini, java, javascript, json, kotlin, markdown, php, python, ruby,
  rust, shell, sql, swift, typescript, xml, yaml,
};
for (const [name, language] of Object.entries(languages)) hljs.registerLanguage(name, language);
// The text is already sanitized and set as text; nothing in a code element is markup.
hljs.configure({ ignoreUnescapedHTML: true });

/** Longer blocks are left plain while guessing: guessing runs every language over the text. */
const GUESS_LIMIT = 20_000;

/** Highlights every code block under `root` (a block in a known language, or a guess). */
export function highlightCode(root: HTMLElement) {
  for (const code of root.querySelectorAll<HTMLElement>("pre > code")) {
    const fence = [...code.classList].find((c) => c.startsWith("language-"))?.slice("language-".length);
    const known = fence && hljs.getLanguage(fence);
    if (fence && !known) continue;
    if (!fence && (code.textContent ?? "").length > GUESS_LIMIT) continue;
    const result = known
      ? hljs.highlight(code.textContent ?? "", { language: fence, ignoreIllegals: true })
      : hljs.highlightAuto(code.textContent ?? "");
    // highlight.js escapes the text it wraps in spans: the result is safe as HTML.
    code.innerHTML = result.value;
    code.classList.add("hljs");
    code.dataset.language = result.language ?? "";
  }
}
