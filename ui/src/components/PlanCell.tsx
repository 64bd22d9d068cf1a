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
    `the model takes up to ${k(plan.max_context)} tokens`
  );
}

/** "4 × 8.2k ctx": the context each of the plan's requests gets at once (nothing when none). */
export function PlanContext({ plan }: { plan: ServingPlan }) {
  if (plan.context_tokens <= 0) return null;
  return (
    <span data-testid="plan-context" title={planTitle(plan)}>
      {plan.rows} × {k(plan.context_tokens)} ctx{" "}
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
