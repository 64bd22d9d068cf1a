// Addresses inside the UI that several pages link to.

/** A model's page: `id` for a model on disk, `repo` for one on the Hub. */
export function modelPageHref(key: "id" | "repo", value: string): string {
  return `#/model?${key}=${encodeURIComponent(value)}`;
}
