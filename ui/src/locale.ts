// WebKitGTK reports the POSIX locale "C" as navigator.language when LANG is unset, and Intl
// refuses that tag; uPlot builds a NumberFormat from it as soon as it loads. Imported first
// (before anything that imports uPlot), this swaps such a tag for a valid one.
try {
  new Intl.NumberFormat(navigator.language);
} catch {
  Object.defineProperty(navigator, "language", { value: "en-US", configurable: true });
}

export {};
