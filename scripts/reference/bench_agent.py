"""An agent replay against any OpenAI-compatible server: what a coding agent does to it.

A ~4,300-token system prompt holding a pasted Python source file, then turns of a conversation
(each resends everything: the prompt, the previous answers, one new message), a second
conversation with the same system prompt, and optionally 16 agents at once sharing it.
Streaming chat at temperature 0; prints the time to first token of each step.

    .cache/venv/bin/python scripts/reference/bench_agent.py --url http://127.0.0.1:8090 \\
        --label "fastmlx serve" --phase before-restart --state /tmp/agent.json
    (restart the server)
    .cache/venv/bin/python scripts/reference/bench_agent.py ... --phase after-restart --state /tmp/agent.json

The conversation is kept in --state between the two phases, so the turn after the restart is
exactly the next turn of the same conversation.
"""

import argparse
import inspect
import json
import statistics
import threading
import time
import urllib.request

QUESTIONS = [
    "Read the source above. What does the ArgumentParser class do? Answer in two sentences.",
    "Which method parses the command line? Name it and say what it returns.",
    "Suggest one small refactoring of _get_values and say why it helps.",
    "Is there a bug in how mutually exclusive groups are checked? Answer briefly.",
    "Write a one-line docstring for parse_known_args.",
]


def system_prompt(chars: int) -> str:
    import argparse as source_module

    source = inspect.getsource(source_module)[:chars]
    return (
        "You are a coding assistant inside an IDE. The user's open file is below; answer questions about it "
        "briefly and precisely.\n\n```python\n" + source + "\n```"
    )


def chat(url, messages, max_tokens, model=None):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer x"})
    start = time.perf_counter()
    first, text, usage = None, "", {}
    with urllib.request.urlopen(req, timeout=1800) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and first is None:
                    first = time.perf_counter()
                text += piece
    return (first or time.perf_counter()) - start, text, usage


def report(label, step, ttft, usage, cold=None):
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    share = f"  ({100 * ttft / cold:.1f}% of cold)" if cold else ""
    print(f"{label:<28} {step:<34} prompt {usage.get('prompt_tokens', '?'):>5} tok, cached {cached if cached is not None else '-':>5}  "
          f"TTFT {ttft:7.2f} s{share}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--model")
    ap.add_argument("--phase", choices=["before-restart", "after-restart", "agents"], required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--system-chars", type=int, default=18260)
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--agents", type=int, default=16)
    args = ap.parse_args()
    system = system_prompt(args.system_chars)

    if args.phase == "before-restart":
        messages = [{"role": "system", "content": system}]
        results = {}
        for turn, question in enumerate(QUESTIONS[:3]):
            messages.append({"role": "user", "content": question})
            ttft, text, usage = chat(args.url, messages, args.answer_tokens, args.model)
            messages.append({"role": "assistant", "content": text})
            step = "cold first turn" if turn == 0 else f"next turn ({turn + 1})"
            results.setdefault("cold", ttft)
            report(args.label, step, ttft, usage, None if turn == 0 else results["cold"])
        other = [{"role": "system", "content": system}, {"role": "user", "content": QUESTIONS[4]}]
        ttft, _, usage = chat(args.url, other, args.answer_tokens, args.model)
        report(args.label, "2nd conversation, same system", ttft, usage, results["cold"])
        json.dump({"messages": messages, "cold": results["cold"]}, open(args.state, "w"))
    elif args.phase == "after-restart":
        state = json.load(open(args.state))
        messages = state["messages"] + [{"role": "user", "content": QUESTIONS[3]}]
        ttft, _, usage = chat(args.url, messages, args.answer_tokens, args.model)
        report(args.label, "next turn after a restart", ttft, usage, state["cold"])
    else:
        # Agents at once, one system prompt (already seen): each with its own question.
        results, lock = [], threading.Lock()

        def agent(i):
            msgs = [{"role": "system", "content": system}, {"role": "user", "content": f"Agent {i}: " + QUESTIONS[i % len(QUESTIONS)]}]
            ttft, _, usage = chat(args.url, msgs, args.answer_tokens, args.model)
            with lock:
                results.append((ttft, usage))

        threads = [threading.Thread(target=agent, args=(i,)) for i in range(args.agents)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ttfts = sorted(r[0] for r in results)
        cached = [((r[1].get("prompt_tokens_details") or {}).get("cached_tokens") or 0) for r in results]
        p95 = ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))]
        print(f"{args.label:<28} {args.agents} agents at once, same system   TTFT p50 {statistics.median(ttfts):.2f} s, p95 {p95:.2f} s, "
              f"cached per request min {min(cached)} tok, all done in {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
