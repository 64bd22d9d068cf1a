// The configurations that point a client at this server (the Server page's cards, a model's page
// with its id filled in): the coding agents' from ui/src/agents/, then IDEs, Open WebUI, Python.
import { agentConfigs, fillAgentConfig } from "./agents";

export interface Snippet {
  name: string;
  id: string;
  where: string;
  text: string;
}

export interface SnippetTarget {
  /** The OpenAI base URL, ending in /v1. */
  url: string;
  keyText: string;
  modelId: string;
  embedId: string;
  /** The context window served, which agents must be told. */
  context: number | null;
}

export function clientSnippets({ url, keyText, modelId, embedId, context }: SnippetTarget): Snippet[] {
  return [
    ...agentConfigs.map((agent) => ({
      name: agent.name,
      id: agent.id,
      where: agent.where,
      text: fillAgentConfig(agent.template, {
        base: url.replace(/\/v1$/, ""),
        model: modelId,
        context: context ? String(context) : "CONTEXT_TOKENS",
        key: keyText,
      }),
    })),
    {
      name: "Zed",
      id: "zed",
      where: "settings.json (the API key goes in the Agent panel's settings)",
      text: `"language_models": {
  "openai_compatible": {
    "FastMLX": {
      "api_url": "${url}",
      "available_models": [
        { "name": "${modelId}", "display_name": "${modelId} (FastMLX)", "max_tokens": 32768 }
      ]
    }
  }
}`,
    },
    {
      name: "Cline",
      id: "cline",
      where: "API Provider: OpenAI Compatible",
      text: `Base URL: ${url}
API Key:  ${keyText}
Model ID: ${modelId}`,
    },
    {
      name: "Open WebUI",
      id: "openwebui",
      where: "environment (in Docker, use host.docker.internal instead of 127.0.0.1)",
      text: `OPENAI_API_BASE_URL=${url}
OPENAI_API_KEY=${keyText}`,
    },
    {
      name: "Continue: embeddings (codebase index)",
      id: "continue-embed",
      where: "~/.continue/config.yaml, beside the chat model",
      text: `models:
  - name: FastMLX embeddings
    provider: openai
    model: ${embedId}
    apiBase: ${url}
    apiKey: ${keyText}
    roles: [embed]`,
    },
    {
      name: "Open WebUI: documents (RAG)",
      id: "openwebui-embed",
      where: "Admin Settings → Documents, or the environment",
      text: `RAG_EMBEDDING_ENGINE=openai
RAG_OPENAI_API_BASE_URL=${url}
RAG_OPENAI_API_KEY=${keyText}
RAG_EMBEDDING_MODEL=${embedId}`,
    },
    {
      name: "Python (openai)",
      id: "python",
      where: "pip install openai",
      text: `from openai import OpenAI

client = OpenAI(base_url="${url}", api_key="${keyText}")
reply = client.chat.completions.create(
    model="${modelId}",
    messages=[{"role": "user", "content": "Hello!"}],
)
print(reply.choices[0].message.content)`,
    },
  ];
}
