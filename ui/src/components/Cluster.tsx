import { useState } from "preact/hooks";
import { postJson, type ClusterStatus } from "../api";
import { ErrorBox } from "./common";
import { bytes, rate } from "../format";

/** Milliseconds with a decimal below 10 (a step's wait on loopback is a fraction of one). */
function millis(seconds: number): string {
  const v = seconds * 1e3;
  if (!Number.isFinite(v)) return "–";
  return v < 10 ? `${v.toFixed(2)} ms` : `${Math.round(v)} ms`;
}

/** By tensors: the time in the sums with the other machines, as rank 0 timed it apart from its
 * layers on a step now and then (timing every step would cost each its single evaluation), decode
 * steps and prompt steps apart. A timed step runs longer than others, hence its own step time. */
function SumsTimed({ timed }: { timed: ClusterStatus["sums_timed"] }) {
  const kinds = [
    ["decode", timed.decode],
    ["prompt", timed.prompt],
  ] as const;
  const shown = kinds.filter(([, t]) => t.steps > 0);
  if (!shown.length) return <span data-testid="cluster-sums">the sums with the other machines not timed yet</span>;
  return (
    <span
      data-testid="cluster-sums"
      title="The transfers, and any machine still computing its share; the step's own layers are the rest"
    >
      in the sums with the other machines:{" "}
      {shown
        .map(
          ([name, t]) =>
            `${name} ${millis(t.sum_seconds / t.steps)} of a ${millis(t.step_seconds / t.steps)} step (${t.steps} timed)`,
        )
        .join(", ")}
    </span>
  );
}

/** Machines the cluster serves without that are back: taking them in reloads the model across
 * the machines (requests are answered 503 meanwhile, minutes for a large model). */
function TakeBack({
  back,
  held,
  asked,
}: {
  back: string[];
  held: NonNullable<ClusterStatus["held"]>;
  /** `--take-back asked`: nothing is taken back by itself. */
  asked: boolean;
}) {
  const [state, setState] = useState<{ asked?: boolean; error?: string }>({});
  const ask = async () => {
    try {
      await postJson("/admin/cluster/take-back", {});
      setState({ asked: true });
    } catch (e) {
      setState({ error: String(e instanceof Error ? e.message : e) });
    }
  };
  return (
    <div class="note" data-testid="cluster-back">
      <p>
        {back.length ? `${back.join(", ")} ${back.length === 1 ? "is" : "are"} back. ` : ""}
        {held
          .map(
            (h) =>
              `${h.machine} is back, held off since its last take-in failed` +
              (asked
                ? ": take it back once its cause is mended. "
                : `: tried again by itself in ${Math.max(1, Math.ceil(h.seconds_left / 60))} min, or now if you take it back. `),
          )
          .join("")}
        Taking {back.length + held.length === 1 ? "it" : "them"} in reloads the model across the machines: requests
        are answered 503 until it has loaded.
      </p>
      <button type="button" onClick={ask} disabled={state.asked} data-testid="cluster-take-back">
        {state.asked ? "Taking back…" : "Take back now"}
      </button>
      <ErrorBox error={state.error ?? null} />
    </div>
  );
}

/** A model split across several machines (`fastmlx serve --cluster`): which machine holds which
 * layers, each link as measured when the cluster formed, and what a step through the pipeline
 * costs (averaged since the model loaded); a lost machine is said first, and the host file's
 * machines it serves without. */
export function ClusterSection({ model, cluster, fault }: { model: string; cluster: ClusterStatus; fault?: string }) {
  const steps = Math.max(cluster.steps, 1);
  const per = (v: number) => v / steps;
  const layers = cluster.nodes.reduce((n, node) => Math.max(n, node.end_layer), 0);
  const tensor = cluster.parallel === "tensor";
  // Every other machine gone past --drop-after: rank 0 serves the whole model by itself.
  const alone = cluster.nodes.length === 1;
  const holds = (n: ClusterStatus["nodes"][number]) =>
    alone
      ? `the whole model (${layers} layers)`
      : tensor
      ? `1/${cluster.nodes.length} of every layer's heads and MLP columns (${layers} layers) + embeddings and output head`
      : `layers ${n.first_layer}–${n.end_layer - 1} of ${layers}${n.ends ? " + embeddings and output head" : ""}`;
  return (
    <div class="card cluster" data-testid="cluster" data-model={model} data-alone={String(alone)}>
      <h2>
        Cluster · {model} ·{" "}
        {alone
          ? "on this machine alone"
          : `${cluster.nodes.length} machines (${cluster.backend}${tensor ? ", split by tensors" : ", pipeline"})`}
      </h2>
      <ErrorBox error={fault ?? null} />
      {cluster.without?.length ? (
        <p class="note warn-note" data-testid="cluster-without">
          Serving without {cluster.without.join(", ")}: gone when the cluster formed; taken back once it returns
          {cluster.take_back === "asked" ? " and you take it back here" : " and the server is idle"}
          {alone ? " (the model stays loaded here meanwhile)" : ""}.
        </p>
      ) : null}
      {cluster.back?.length || cluster.held?.length ? (
        <TakeBack back={cluster.back ?? []} held={cluster.held ?? []} asked={cluster.take_back === "asked"} />
      ) : null}
      <div class="table-wrap">
        <table class="compact" data-testid="cluster-nodes">
          <thead>
            <tr>
              <th class="num">Rank</th>
              <th>Address</th>
              <th class="num">Room for weights</th>
              <th>Holds</th>
            </tr>
          </thead>
          <tbody>
            {cluster.nodes.map((n) => (
              <tr key={n.rank} data-testid="cluster-node">
                <td class="num">{n.rank}</td>
                <td>{n.host}</td>
                <td class="num">{bytes(n.room_bytes)}</td>
                <td data-testid="cluster-holds">
                  {holds(n)}
                  {n.rank === cluster.nodes[0]?.rank ? " (runs the engine)" : ""}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      {!alone && (
        <>
      <p class="muted" data-testid="cluster-links">
        {cluster.links.map((l) => (
          <span key={`${l.from}-${l.to}`}>
            link {l.from}→{l.to}: {l.round_trip_ms.toFixed(2)} ms round trip, {rate(l.megabytes_per_second, "MB/s")}
            {" · "}
          </span>
        ))}
        measured when the cluster formed
      </p>
      <p data-testid="cluster-steps" title="Sums since the model loaded, per step through the model">
        {cluster.steps} steps · {bytes(per(cluster.bytes_per_hop))} {tensor ? "sent by each machine" : "per hop"} per step ·
        step {millis(per(cluster.step_seconds))}
        {tensor ? (
          <>
            {" "}· <SumsTimed timed={cluster.sums_timed} />
          </>
        ) : (
          `, of which waiting on the other machines ${millis(per(cluster.wait_seconds))} (their layers and every hop)`
        )}
      </p>
        </>
      )}
    </div>
  );
}
