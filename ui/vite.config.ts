import { defineConfig } from "vite";

// Relative asset paths: the same build works under /ui/ on FastMLX's HTTP server and at the root
// of the desktop app's custom protocol.
export default defineConfig({
  base: "./",
  build: {
    outDir: "dist",
    emptyOutDir: true,
    target: "es2022",
    chunkSizeWarningLimit: 400,
  },
  server: {
    // `npm run dev` proxies the API to a running `fastmlx serve` (FASTMLX_URL, default port 8080).
    proxy: Object.fromEntries(
      ["/v1", "/admin", "/health"].map((p) => [p, process.env.FASTMLX_URL ?? "http://127.0.0.1:8080"]),
    ),
  },
});
