import type { ServingPlan } from "../api";
import { bytes } from "../format";
import { Badge } from "./common";

export const fitKind: Record<string, "ok" | "warn" | "bad"> = { fits: "ok", tight: "warn", "too big": "bad" };

const k = (n: number) => (n >= 1000 ? `${(n / 1000).toFixed(n >= 10_000 ? 0 : 1)}k` : String(n));

/** The arithmetic behind a plan, for a tooltip. */
function planTitle(plan: ServingPlan): string {
  return (
    `weights ${bytes(plan.weights_bytes)}, KV ${bytes(plan.kv_bytes_per_token * 1000)} per 1k tokens, ` +
    `KV budget ${bytes(plan.kv_budget_bytes)} under the ceiling of ${bytes(plan.ceiling_bytes)}; ` +
    `the model takes up to ${k(plan.max_context)} tokens` +
    quantizedContext(plan)
  );
}

/** What the same memory holds with the KV cache quantized (the Server page's KV bits setting). */
function quantizedContext(plan: ServingPlan): string {
  const kv8 = plan.context_tokens_kv8;
  const kv4 = plan.context_tokens_kv4;
  if (!kv8 || !kv4 || plan.context_tokens <= 0) return "";
  return `; with the KV cache at 8 bits ${plan.rows} × ${k(kv8)}, at 4 bits ${plan.rows} × ${k(kv4)}`;
}

/** "8-bit KV: 4 × 30k": the context the plan's requests get with a quantized KV cache. */
function PlanQuantized({ plan }: { plan: ServingPlan }) {
  const kv8 = plan.context_tokens_kv8;
  if (!kv8 || plan.context_tokens <= 0 || kv8 <= plan.context_tokens) return null;
  return (
    <span class="muted" data-testid="plan-kv8">
      {" "}
      (8-bit KV: {k(kv8)})
    </span>
  );
}

/** "4 × 8.2k ctx": the context each of the plan's requests gets at once (nothing when none). */
export function PlanContext({ plan }: { plan: ServingPlan }) {
  if (plan.context_tokens <= 0) return null;
  return (
    <span data-testid="plan-context" title={planTitle(plan)}>
      {plan.rows} × {k(plan.context_tokens)} ctx
      <PlanQuantized plan={plan} />{" "}
    </span>
  );
}

/** The plan's context and its fit badge, with the arithmetic behind them in the tooltip. */
export function PlanCell({ plan }: { plan: ServingPlan | null | undefined }) {
  if (!plan) return <span class="muted">–</span>;
  return (
    <span title={planTitle(plan)}>
      <PlanContext plan={plan} />
      <Badge kind={fitKind[plan.fit] ?? "muted"} testid="plan-fit">
        {plan.fit}
      </Badge>
    </span>
  );
}
