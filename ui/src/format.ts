// Numbers for people: bytes, parameter counts, durations, rates.

export function bytes(n: number | null | undefined): string {
  if (n == null || !Number.isFinite(n)) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  let v = n;
  while (v >= 1000 && i < units.length - 1) {
    v /= 1000;
    i++;
  }
  return `${i === 0 ? v : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)} ${units[i]}`;
}

/** 135M, 1.5B, 70B. */
export function params(n: number | null | undefined): string {
  if (n == null || !Number.isFinite(n) || n <= 0) return "–";
  const scales: [number, string][] = [
    [1e12, "T"],
    [1e9, "B"],
    [1e6, "M"],
    [1e3, "K"],
  ];
  for (const [scale, suffix] of scales) {
    if (n >= scale) {
      const v = n / scale;
      return `${v >= 100 ? Math.round(v) : v >= 10 ? trim(v.toFixed(0)) : trim(v.toFixed(1))}${suffix}`;
    }
  }
  return String(n);
}

function trim(s: string): string {
  return s.replace(/\.0$/, "");
}

export function count(n: number | null | undefined): string {
  if (n == null || !Number.isFinite(n)) return "–";
  if (n >= 1e6) return `${trim((n / 1e6).toFixed(1))}M`;
  if (n >= 1e4) return `${Math.round(n / 1e3)}K`;
  if (n >= 1e3) return `${trim((n / 1e3).toFixed(1))}K`;
  return String(n);
}

export function duration(secs: number | null | undefined): string {
  if (secs == null || !Number.isFinite(secs)) return "–";
  const s = Math.max(0, Math.round(secs));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

export function ms(v: number | null | undefined): string {
  if (v == null || !Number.isFinite(v)) return "–";
  return v >= 1000 ? `${(v / 1000).toFixed(2)} s` : `${Math.round(v)} ms`;
}

export function rate(v: number | null | undefined, unit = "tok/s"): string {
  if (v == null || !Number.isFinite(v)) return "–";
  return `${v >= 100 ? Math.round(v) : v.toFixed(1)} ${unit}`;
}

export function percent(done: number, total: number): number {
  return total > 0 ? Math.min(100, (100 * done) / total) : 0;
}
