"""Starts `fastmlx serve` on a free port with the default model (SmolLM2) for the client tests."""

import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("FASTMLX_BIN", ROOT / "target/debug/fastmlx"))


def launch(tmp_path_factory, log_name, extra=(), models=None):
    """`fastmlx serve` on free ports, isolated from the machine's models and caches; yields its
    URLs and first model id, then shuts it down (and checks that it shut down cleanly).
    `models`: a folder of models the server finds (none by default)."""
    log = open(ROOT / "target" / log_name, "w+")
    # Model discovery looks only at empty folders: the machine's own models stay out of the tests.
    empty = tmp_path_factory.mktemp("no-models")
    env = {**os.environ, "FASTMLX_MODELS_DIR": str(models or empty), "HF_HUB_CACHE": str(empty),
           "LMSTUDIO_MODELS_DIR": str(empty)}
    # The prefix cache's disk tier in a folder of its own, not the machine's cache.
    env["FASTMLX_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    # `--ollama-port 0`: the second listener, where Ollama clients look, on a free port here.
    command = [str(BINARY), "serve", "--port", "0", "--ollama-port", "0", *extra]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = ollama = None
    deadline = time.time() + 120
    while ollama is None and time.time() < deadline:
        assert proc.poll() is None, f"fastmlx serve exited: {Path(log.name).read_text()}"
        text = Path(log.name).read_text()
        url = (re.search(r"serving \S+ at (http://\S+/v1)", text) or [None, None])[1]
        ollama = (re.search(r"Ollama API also at (http://\S+)", text) or [None, None])[1]
        time.sleep(0.1)
    assert url and ollama, "fastmlx serve did not start"
    model = urllib.request.urlopen(url + "/models").read()
    yield {"url": url, "base": url[: -len("/v1")], "ollama": ollama, "model": __import__("json").loads(model)["data"][0]["id"]}
    proc.terminate()
    assert proc.wait(timeout=30) == 0, "graceful shutdown"


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    yield from launch(tmp_path_factory, "client-tests-server.log", ["--max-batch", "16"])
