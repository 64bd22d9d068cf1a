// A fake Hugging Face Hub on 127.0.0.1 for the Discover page (HF_ENDPOINT points the server at
// it): model search, the model API with blobs, and file downloads with Range, in the Hub's
// shapes; files are sent in small chunks with a pause between them, slow enough to watch the
// progress and to cancel midway.
import { createHash } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { createServer } from "node:http";
import { totalmem } from "node:os";
import path from "node:path";

const CHUNK = 32 << 10;

/**
 * repos: [{ id, dir (a model folder to serve), downloads, likes, params (safetensors element
 * counts by dtype, for search hits without files) }]. Returns { url, setDelay(ms), requests, close() }.
 */
export async function startFakeHub(repos) {
  const models = repos.map((r) => {
    const files = r.dir
      ? readdirSync(r.dir).map((name) => {
          const bytes = readFileSync(path.join(r.dir, name));
          return { name, bytes, sha256: createHash("sha256").update(bytes).digest("hex") };
        })
      : [];
    return { ...r, files, sha: createHash("sha1").update(r.id).digest("hex") };
  });
  let delay = 20;
  const requests = [];

  const wire = (m) => ({
    id: m.id,
    downloads: m.downloads ?? 0,
    likes: m.likes ?? 0,
    tags: ["mlx", "safetensors", ...(m.tags ?? [])],
    lastModified: "2026-11-01T10:00:00.000Z",
    library_name: "mlx",
    gated: false,
    siblings: m.files.map((f) => ({ rfilename: f.name })),
    safetensors: m.params ? { parameters: m.params, total: Object.values(m.params).reduce((a, b) => a + b, 0) } : undefined,
  });

  const server = createServer(async (req, res) => {
    const url = new URL(req.url, "http://hub");
    requests.push(`${req.method} ${url.pathname}`);
    const json = (status, body) => {
      res.writeHead(status, { "Content-Type": "application/json" });
      res.end(JSON.stringify(body));
    };
    if (url.pathname === "/api/models") {
      const q = (url.searchParams.get("search") ?? "").toLowerCase();
      if (q === "explode") return json(500, { error: "Internal Error - We're working hard to fix this as soon as possible!" });
      const hits = models.filter((m) => m.id.toLowerCase().includes(q));
      hits.sort((a, b) => (b.downloads ?? 0) - (a.downloads ?? 0));
      return json(200, hits.slice(0, Number(url.searchParams.get("limit") ?? 20)).map(wire));
    }
    let match = url.pathname.match(/^\/api\/models\/([^/]+\/[^/]+)\/revision\/([^/]+)$/);
    if (match) {
      const m = models.find((x) => x.id === decodeURIComponent(match[1]));
      if (!m) return json(404, { error: "Repository not found" });
      return json(200, {
        ...wire(m),
        sha: m.sha,
        siblings: m.files.map((f) =>
          f.name.endsWith(".safetensors")
            ? { rfilename: f.name, size: f.bytes.length, lfs: { sha256: f.sha256, size: f.bytes.length } }
            : { rfilename: f.name, size: f.bytes.length },
        ),
      });
    }
    match = url.pathname.match(/^\/([^/]+\/[^/]+)\/resolve\/([^/]+)\/(.+)$/);
    if (match) {
      const m = models.find((x) => x.id === decodeURIComponent(match[1]));
      const file = m?.files.find((f) => f.name === decodeURIComponent(match[3]));
      if (!file) return json(404, { error: "Entry not found" });
      const size = file.bytes.length;
      let start = 0;
      const range = req.headers.range?.match(/^bytes=(\d+)-$/);
      if (range) {
        start = Number(range[1]);
        if (start >= size) {
          res.writeHead(416, { "Content-Range": `bytes */${size}` });
          return res.end();
        }
        res.writeHead(206, { "Content-Length": size - start, "Content-Range": `bytes ${start}-${size - 1}/${size}`, ETag: `"${file.sha256}"` });
      } else {
        res.writeHead(200, { "Content-Length": size, ETag: `"${file.sha256}"` });
      }
      for (let at = start; at < size && !res.destroyed; at += CHUNK) {
        res.write(file.bytes.subarray(at, Math.min(size, at + CHUNK)));
        if (delay) await new Promise((r) => setTimeout(r, delay));
      }
      return res.end();
    }
    json(404, { error: "not found" });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    requests,
    setDelay: (ms) => {
      delay = ms;
    },
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(resolve);
      }),
  };
}

/** Element counts (bf16) whose weights need about `fraction` of this machine's memory (the
 * server's default ceiling is 70 % of it: "fits" up to four fifths of that, "tight" up to it). */
export function bf16ParamsFor(fraction) {
  // The server estimates memory as 1.2 × the storage size (plus its own baseline).
  return { BF16: Math.round((totalmem() * fraction) / 1.2 / 2) };
}
