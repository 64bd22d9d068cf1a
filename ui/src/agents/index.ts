// The coding agents' configurations, as tests/agents runs them against a real server: the
// Server page fills in the placeholders, docs/agents.md shows them with its defaults, and a
// test checks that the copies there are these files.
import claudeCode from "./claude-code.sh?raw";
import codex from "./codex.toml?raw";
import continueYaml from "./continue.yaml?raw";
import copilot from "./copilot.sh?raw";
import grok from "./grok.sh?raw";
import kilo from "./kilo.json?raw";
import opencode from "./opencode.json?raw";
import piModels from "./pi-models.json?raw";
import qwenCode from "./qwen-code.sh?raw";

export interface AgentConfig {
  name: string;
  id: string;
  where: string;
  template: string;
}

export const agentConfigs: AgentConfig[] = [
  { name: "Codex CLI", id: "codex", where: "~/.codex/config.toml", template: codex },
  { name: "Claude Code", id: "claude-code", where: "shell environment, before `claude`", template: claudeCode },
  { name: "Continue (IDE and cn)", id: "continue", where: "~/.continue/config.yaml", template: continueYaml },
  { name: "opencode", id: "opencode", where: "opencode.json (project) or ~/.config/opencode/opencode.json", template: opencode },
  { name: "Kilo Code CLI", id: "kilo", where: "kilo.json (project), then `kilo`", template: kilo },
  { name: "Qwen Code", id: "qwen-code", where: "shell environment, then `qwen --auth-type openai`", template: qwenCode },
  { name: "GitHub Copilot CLI", id: "copilot", where: "shell environment, then `copilot`", template: copilot },
  { name: "pi", id: "pi", where: "~/.pi/agent/models.json, then `pi --provider fastmlx --model <id>`", template: piModels },
  { name: "Grok CLI", id: "grok", where: "shell environment, then `grok`", template: grok },
];

/** What a configuration names: the server's root URL, the model, its context window, the key. */
export interface AgentTarget {
  base: string;
  model: string;
  context: string;
  key: string;
}

/** A template with its `{base}`, `{model}`, `{context}` and `{key}` filled in. */
export function fillAgentConfig(template: string, t: AgentTarget): string {
  return template
    .replaceAll("{base}", t.base)
    .replaceAll("{model}", t.model)
    .replaceAll("{context}", t.context)
    .replaceAll("{key}", t.key)
    .trimEnd();
}
