"""The coding agents' own published binaries (pinned in package.json, installed by
`scripts/setup.sh --test`) against `fastmlx serve`, each through the configuration the Server page
and the README give (ui/src/agents/), a whole turn with a tool in it:

Codex CLI, Claude Code, Continue's cn, opencode, Kilo Code CLI, Qwen Code, GitHub Copilot CLI, pi
and Grok CLI:

1. the agent sends its real prompt (system prompt, its tool schemas: 1.5k-18.5k tokens);
2. the model calls the agent's shell tool to write `tool-proof.txt`;
3. the agent runs the command and sends the result back;
4. the model answers `Round_trip_complete.`, the agent prints it and exits 0.

The model is scripted (`make-test-model --scripted hermes`): SmolLM2's tokenizer, so prompts are
as long as a real model's, a 64k context, Qwen 2.5's Hermes tool-call format, and a chat template
that cues the answer once the last message is a tool result. The server requires an API key (each
configuration carries it) and logs every request; a 4xx, a 5xx or any warning fails the test.

Run by scripts/test.sh inside scripts/loopback_only.sh: no network but loopback, so the agents can
reach the local server and nothing else (no telemetry, update checks or model catalogs).
"""

import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("FASTMLX_BIN", ROOT / "target/debug/fastmlx"))
AGENT_BIN = ROOT / "tests/agents/node_modules/.bin"
CONFIGS = ROOT / "ui/src/agents"
TOKENIZER = ROOT / ".cache/models/SmolLM2-135M-Instruct-mlx-4bit/tokenizer.json"
KEY = "agent-test-key"
# The scripted models' context window (their config's max_position_embeddings).
CONTEXT = 65536
PROOF = "fastmlx-tool-ran"
ANSWER = "Round_trip_complete."
# The call each scripted model makes: the agent's own shell tool (one space at most: see
# `scripted::hermes_round_trip`).
COMMAND = f"echo {PROOF}>tool-proof.txt"
CALLS = {
    "codex": f'{{"name":"exec_command","arguments":{{"cmd":"{COMMAND}"}}}}',
    "claude-code": f'{{"name":"Bash","arguments":{{"command":"{COMMAND}"}}}}',
    "continue": f'{{"name":"Bash","arguments":{{"command":"{COMMAND}"}}}}',
    "opencode": f'{{"name":"bash","arguments":{{"command":"{COMMAND}","description":"Writes_the_proof_file"}}}}',
    "kilo": f'{{"name":"bash","arguments":{{"command":"{COMMAND}"}}}}',
    "qwen-code": f'{{"name":"run_shell_command","arguments":{{"command":"{COMMAND}"}}}}',
    "copilot": f'{{"name":"bash","arguments":{{"command":"{COMMAND}","description":"Writes_the_proof_file"}}}}',
    "pi": f'{{"name":"bash","arguments":{{"command":"{COMMAND}"}}}}',
    "grok": f'{{"name":"bash","arguments":{{"command":"{COMMAND}"}}}}',
}
# The API each agent speaks.
ENDPOINTS = {"codex": "/v1/responses", "claude-code": "/v1/messages"}
CHAT = "/v1/chat/completions"
AGENT_TIMEOUT = 240
# Less than the shortest prompts seen from these agents (pi's first: ~1,500 tokens).
MIN_PROMPT_TOKENS = 1000


def fill(template, base, model, context=CONTEXT, key=KEY):
    """As the Server page fills a configuration in (ui/src/agents/index.ts)."""
    for name, value in (("base", base), ("model", model), ("context", str(context)), ("key", key)):
        template = template.replace("{" + name + "}", value)
    return template.rstrip()


@pytest.fixture(scope="session", autouse=True)
def loopback_only():
    """The agents must not reach the internet: this process's network namespace has `lo` only."""
    interfaces = [line.split(":")[0].strip() for line in Path("/proc/net/dev").read_text().splitlines()[2:]]
    assert interfaces == ["lo"], (
        f"network interfaces {interfaces}: run these tests through scripts/loopback_only.sh (as scripts/test.sh does)")


class Server:
    """`fastmlx serve` with one scripted model, its request log kept."""

    def __init__(self, tmp: Path, agent: str):
        self.model = f"agent-{agent}"
        model_dir = tmp / self.model
        subprocess.run([str(BINARY), "make-test-model", "--scripted", "hermes",
                        "--chat-template", str(ROOT / "tests/agents/round_trip.jinja"), "--tokenizer", str(TOKENIZER),
                        "--call", CALLS[agent], "--answer", ANSWER, str(model_dir)],
                       check=True, capture_output=True)
        self.log_path = ROOT / "target" / f"agent-{agent}-server.log"
        self.log = open(self.log_path, "w+")
        empty = tmp / "no-models"
        empty.mkdir()
        env = {**os.environ, "FASTMLX_MODELS_DIR": str(empty), "HF_HUB_CACHE": str(empty),
               "LMSTUDIO_MODELS_DIR": str(empty), "FASTMLX_CACHE_DIR": str(tmp / "cache"),
               "FASTMLX_LOG": "warn,fastmlx::http=info"}
        env.pop("FASTMLX_API_KEY", None)
        self.proc = subprocess.Popen([str(BINARY), "serve", "--model", str(model_dir), "--port", "0",
                                      "--ollama-port", "0", "--api-key", KEY],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 60
        self.base = None
        while self.base is None and time.time() < deadline and self.proc.poll() is None:
            found = re.search(r"serving \S+ at (http://\S+)/v1", self.log_path.read_text())
            self.base = found and found[1]
            time.sleep(0.1)
        if not self.base:
            # Not left running (scripts/test.sh fails a run that leaves a fastmlx behind).
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"fastmlx serve did not start: {self.log_path.read_text()}")

    def requests(self):
        """(method, path, status) of every request so far."""
        return [(m[1], m[2], int(m[3])) for m in
                re.finditer(r"fastmlx::http: (\w+) (\S+) (\d{3}) ", self.log_path.read_text())]

    def metrics(self):
        """The server's Prometheus counters, by name (one model)."""
        request = urllib.request.Request(self.base + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
        text = urllib.request.urlopen(request).read().decode()
        return {m[1]: float(m[2]) for m in re.finditer(r"^(fastmlx_\w+)\{[^}]*\} (\S+)$", text, re.M)}

    def stop(self):
        self.proc.terminate()
        assert self.proc.wait(timeout=30) == 0, "graceful shutdown"


@pytest.fixture
def session(tmp_path):
    """A server, a home folder and a project folder of the test's own."""
    servers = []

    def start(agent):
        server = Server(tmp_path, agent)
        servers.append(server)
        home, work = tmp_path / "home", tmp_path / "work"
        home.mkdir()
        work.mkdir()
        return server, home, work

    yield start
    for server in servers:
        server.stop()


def agent_env(home):
    """A clean environment: the agent's settings, sessions and caches in `home`."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR", "FASTMLX_TEST_RUN")}
    return {**keep, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local/share"), "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_STATE_HOME": str(home / ".local/state"), "NO_COLOR": "1"}


def run_agent(command, env, work):
    """The agent, headless, in the project folder, with nothing on stdin."""
    return subprocess.run(command, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=AGENT_TIMEOUT)


def check_turn(agent, server, work, done):
    """The round trip happened and was clean, on the agent's side and the server's."""
    print(done.stdout[-4000:], done.stderr[-4000:], sep="\n--- stderr ---\n")
    requests = server.requests()
    print("requests:", requests)
    assert done.returncode == 0, f"{agent} exited {done.returncode}"
    assert (work / "tool-proof.txt").read_text().strip() == PROOF, "the agent ran the model's tool call"
    assert ANSWER in done.stdout, "the agent printed the model's answer (given only after the tool's result)"
    assert [r for r in requests if r[2] >= 400] == [], "no request refused or failed"
    warnings = [line for line in server.log_path.read_text().splitlines() if " WARN " in line or "ERROR" in line]
    assert warnings == [], "the server logged no warnings"
    turns = [r for r in requests if r[:2] == ("POST", ENDPOINTS.get(agent, CHAT))]
    assert len(turns) >= 2, "the call and the answer, each a request"
    metrics = server.metrics()
    generations = metrics["fastmlx_requests_finished_total"]
    prefilled, reused = metrics["fastmlx_prompt_tokens_total"], metrics["fastmlx_prefix_cache_tokens_reused_total"]
    print(f"{agent}: {generations:.0f} generations, prompts of {(prefilled + reused) / generations:.0f} tokens "
          f"on average, {reused:.0f} tokens restored from the prefix cache, {prefilled:.0f} prefilled")
    # The agent's whole prompt got through (system prompt and tool schemas: thousands of tokens).
    assert (prefilled + reused) / generations > MIN_PROMPT_TOKENS, "a real agent's prompt"


def test_codex(session):
    server, home, work = session("codex")
    codex_home = home / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(fill((CONFIGS / "codex.toml").read_text(), server.base, server.model))
    env = {**agent_env(home), "CODEX_HOME": str(codex_home)}
    done = run_agent([str(AGENT_BIN / "codex"), "exec", "--skip-git-repo-check",
                      "--dangerously-bypass-approvals-and-sandbox", "Write the proof file."], env, work)
    check_turn("codex", server, work, done)


def test_claude_code(session):
    server, home, work = session("claude-code")
    env = {**agent_env(home), **exports(fill((CONFIGS / "claude-code.sh").read_text(), server.base, server.model))}
    # As root (CI, containers), skipping permission prompts needs the agent told it is sandboxed.
    env["IS_SANDBOX"] = "1"
    done = run_agent([str(AGENT_BIN / "claude"), "-p", "Write the proof file.", "--dangerously-skip-permissions"],
                     env, work)
    check_turn("claude-code", server, work, done)
    # The configuration's context window was taken (else it assumes 1M and says so).
    assert "assumes a context window" not in done.stderr


def test_continue_cli(session):
    server, home, work = session("continue")
    config = home / ".continue" / "config.yaml"
    config.parent.mkdir()
    config.write_text(fill((CONFIGS / "continue.yaml").read_text(), server.base, server.model))
    env = {**agent_env(home), "CONTINUE_GLOBAL_DIR": str(config.parent)}
    done = run_agent([str(AGENT_BIN / "cn"), "-p", "Write the proof file.", "--config", str(config), "--auto"],
                     env, work)
    check_turn("continue", server, work, done)


def test_opencode(session):
    server, home, work = session("opencode")
    (work / "opencode.json").write_text(fill((CONFIGS / "opencode.json").read_text(), server.base, server.model))
    # No model catalog fetched, no plugin installed from npm at start: both would need the internet.
    env = {**agent_env(home), "OPENCODE_DISABLE_MODELS_FETCH": "1", "npm_config_offline": "true",
           "OPENCODE_DISABLE_AUTOUPDATE": "1"}
    done = run_agent([str(AGENT_BIN / "opencode"), "run", "Write the proof file."], env, work)
    check_turn("opencode", server, work, done)


def exports(snippet):
    """The variables of a shell snippet of `export NAME=value` lines."""
    return dict(line.removeprefix("export ").split("=", 1) for line in snippet.splitlines())


def test_kilo(session):
    server, home, work = session("kilo")
    (work / "kilo.json").write_text(fill((CONFIGS / "kilo.json").read_text(), server.base, server.model))
    env = {**agent_env(home), "KILO_DISABLE_MODELS_FETCH": "1", "KILO_DISABLE_AUTOUPDATE": "1",
           "npm_config_offline": "true"}
    done = run_agent([str(AGENT_BIN / "kilo"), "run", "--auto", "Write the proof file."], env, work)
    check_turn("kilo", server, work, done)


def test_qwen_code(session):
    server, home, work = session("qwen-code")
    env = {**agent_env(home), **exports(fill((CONFIGS / "qwen-code.sh").read_text(), server.base, server.model)),
           "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}
    done = run_agent([str(AGENT_BIN / "qwen"), "--auth-type", "openai", "--yolo", "Write the proof file."], env, work)
    check_turn("qwen-code", server, work, done)


def test_copilot_cli(session):
    server, home, work = session("copilot")
    # Its first run unpacks ~235 MB: kept between runs (it is the binary, not settings).
    cache = ROOT / "target" / "agent-cache" / "copilot"
    env = {**agent_env(home), **exports(fill((CONFIGS / "copilot.sh").read_text(), server.base, server.model)),
           "COPILOT_AUTO_UPDATE": "false", "COPILOT_CACHE_HOME": str(cache)}
    done = run_agent([str(AGENT_BIN / "copilot"), "-p", "Write the proof file.", "--allow-all-tools"], env, work)
    check_turn("copilot", server, work, done)


def test_pi(session):
    server, home, work = session("pi")
    models = home / ".pi" / "agent" / "models.json"
    models.parent.mkdir(parents=True)
    models.write_text(fill((CONFIGS / "pi-models.json").read_text(), server.base, server.model))
    env = {**agent_env(home), "PI_OFFLINE": "1"}
    done = run_agent([str(AGENT_BIN / "pi"), "-p", "--provider", "fastmlx", "--model", server.model,
                      "Write the proof file."], env, work)
    check_turn("pi", server, work, done)


def test_grok_cli(session):
    server, home, work = session("grok")
    env = {**agent_env(home), **exports(fill((CONFIGS / "grok.sh").read_text(), server.base, server.model))}
    done = run_agent([str(AGENT_BIN / "grok"), "-p", "Write the proof file."], env, work)
    check_turn("grok", server, work, done)


def test_the_docs_show_the_tested_configurations():
    """docs/agents.md's snippets are these files with its defaults filled in: they cannot drift."""
    page = (ROOT / "docs/agents.md").read_text()
    for name in sorted(p.name for p in CONFIGS.iterdir() if p.suffix != ".ts"):
        text = fill((CONFIGS / name).read_text(), "http://127.0.0.1:8080", "SmolLM2-135M-Instruct", 8192, "not-needed")
        assert text in page, f"docs/agents.md lacks the tested {name}:\n{text}"


def test_agents_are_the_pinned_versions():
    """The binaries run are the ones package.json pins (setup installs them with `npm ci`)."""
    pins = json.loads((ROOT / "tests/agents/package.json").read_text())["dependencies"]
    for package, version in pins.items():
        installed = json.loads((ROOT / "tests/agents/node_modules" / package / "package.json").read_text())
        assert installed["version"] == version, package
