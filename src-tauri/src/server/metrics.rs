//! `GET /metrics`: the engine's metrics in Prometheus' text format.

use std::fmt::Write;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::AppState;
use crate::engine::remote::{ClusterLink, ClusterStatus};
use crate::engine::{Histogram, Metrics, LATENCY_BUCKETS};

/// Which histogram of a model's metrics.
type HistogramOf = fn(&Metrics) -> &Histogram;

pub async fn prometheus(State(state): State<AppState>) -> impl IntoResponse {
    let served = state.models.engines();
    let engines: Vec<(String, Metrics)> = served.iter().map(|s| (s.id.clone(), s.engine.snapshot())).collect();
    let clusters: Vec<(String, ClusterStatus, bool)> =
        served.iter().filter_map(|s| s.cluster().map(|c| (s.id.clone(), c, s.engine.fault().is_none()))).collect();
    let mut out = String::new();
    // One series per loaded model, labelled with its id.
    let mut put = |name: &str, kind: &str, help: &str, value: &dyn Fn(&Metrics) -> f64| {
        let _ = writeln!(out, "# HELP fastmlx_{name} {help}\n# TYPE fastmlx_{name} {kind}");
        for (id, m) in &engines {
            let _ = writeln!(out, "fastmlx_{name}{{model=\"{}\"}} {}", label(id), value(m));
        }
    };
    put("running_requests", "gauge", "Rows in the running batch.", &|m| m.running as f64);
    put("queued_requests", "gauge", "Requests waiting to start.", &|m| m.queued as f64);
    put("batch_size", "gauge", "Rows decoded in the last engine step.", &|m| m.batch_size as f64);
    put("prefill_tokens_per_second", "gauge", "Prompt tokens processed per second, last seconds.", &|m| {
        m.prefill_tokens_per_sec
    });
    put("decode_tokens_per_second", "gauge", "Tokens generated per second, last seconds.", &|m| {
        m.decode_tokens_per_sec
    });
    put("kv_cache_tokens", "gauge", "Tokens held in the batch's KV cache.", &|m| m.kv_tokens as f64);
    put("kv_cache_bytes", "gauge", "Bytes allocated for the batch's KV cache.", &|m| m.kv_bytes as f64);
    put("kv_cache_shared_bytes", "gauge", "Of those, a prompt start held once for the rows sharing it.", &|m| {
        m.kv_shared_bytes as f64
    });
    put("kv_cache_peak_bytes", "gauge", "The most bytes the batch's KV cache has held.", &|m| m.kv_peak_bytes as f64);
    put("kv_reserved_bytes", "gauge", "KV bytes reserved by admitted requests.", &|m| m.kv_reserved_bytes as f64);
    put("kv_budget_bytes", "gauge", "KV bytes admitted requests may reserve.", &|m| m.kv_budget_bytes as f64);
    put("mlx_active_bytes", "gauge", "MLX memory in use (the whole process).", &|m| m.mlx_active_bytes as f64);
    put("mlx_peak_bytes", "gauge", "MLX peak memory since the last engine step began.", &|m| m.mlx_peak_bytes as f64);
    put("memory_ceiling_bytes", "gauge", "The memory ceiling the process keeps under.", &|m| {
        m.memory_ceiling_bytes as f64
    });
    put("memory_held_bytes", "gauge", "Memory the process holds (resident, or MLX's count if larger).", &|m| {
        m.memory_held_bytes as f64
    });
    put("mlx_cache_bytes", "gauge", "MLX's buffer cache (freed buffers kept for reuse).", &|m| {
        m.mlx_cache_bytes as f64
    });
    put("memory_step_predicted_bytes", "gauge", "The last measured step's predicted working memory.", &|m| {
        m.memory.predicted_bytes as f64
    });
    put("memory_step_measured_bytes", "gauge", "The same step's working memory by MLX's peak counter.", &|m| {
        m.memory.measured_bytes as f64
    });
    put(
        "memory_prediction_worst_ratio",
        "gauge",
        "The largest measured / predicted ratio of a step's working memory (above 1: an underestimate).",
        &|m| m.memory.worst_ratio,
    );
    put(
        "memory_prediction_worst_excess_bytes",
        "gauge",
        "The most bytes a step's working memory measured over its prediction (0: never underestimated).",
        &|m| m.memory.worst_excess_bytes as f64,
    );
    put("memory_prefill_narrowed_total", "counter", "Prefill chunks narrowed to fit under the ceiling.", &|m| {
        m.memory.narrowed as f64
    });
    put("memory_prefill_deferred_total", "counter", "Prefill steps that waited for memory.", &|m| {
        m.memory.deferred as f64
    });
    put(
        "requests_refused_waited_total",
        "counter",
        "Requests answered 503 after waiting past --max-queue-wait.",
        &|m| m.refused_waited_total as f64,
    );
    put(
        "requests_refused_memory_total",
        "counter",
        "Requests answered 503: not a prompt token fitted under the memory ceiling.",
        &|m| m.refused_memory_total as f64,
    );
    put("requests_parked_total", "counter", "Running requests parked for KV memory, resumed later.", &|m| {
        m.parked_total as f64
    });
    put("requests_total", "counter", "Requests submitted.", &|m| m.requests_total as f64);
    put("requests_finished_total", "counter", "Requests ended, for any reason.", &|m| m.finished_total as f64);
    put("requests_cancelled_total", "counter", "Requests cancelled.", &|m| m.cancelled_total as f64);
    put("requests_failed_total", "counter", "Requests ended by an error.", &|m| m.errors_total as f64);
    put("prompt_tokens_total", "counter", "Prompt tokens prefilled.", &|m| m.prompt_tokens_total as f64);
    put("images_encoded_total", "counter", "Images run through the vision tower.", &|m| m.images_encoded_total as f64);
    put("generated_tokens_total", "counter", "Tokens generated.", &|m| m.generated_tokens_total as f64);
    put("draft_tokens_total", "counter", "Tokens drafted for speculative decoding.", &|m| m.draft_tokens_total as f64);
    put("draft_accepted_total", "counter", "Drafted tokens the model accepted.", &|m| m.draft_accepted_total as f64);
    put("verify_steps_total", "counter", "Decode steps that checked drafted tokens.", &|m| m.verify_steps_total as f64);
    put("prefix_cache_hits_total", "counter", "Requests that reused a cached prompt start.", &|m| {
        m.prefix_cache_hits as f64
    });
    put("prefix_cache_misses_total", "counter", "Requests that reused nothing from the prefix cache.", &|m| {
        m.prefix_cache_misses as f64
    });
    put("prefix_cache_tokens_reused_total", "counter", "Prompt tokens restored from the prefix cache.", &|m| {
        m.prefix_cache_tokens_reused as f64
    });
    put("prefix_cache_bytes", "gauge", "Bytes held by the prefix cache (RAM).", &|m| m.prefix_cache_bytes as f64);
    put("encoded_images_bytes", "gauge", "Bytes held by the cache of encoded images.", &|m| {
        m.encoded_images_bytes as f64
    });
    put("prefix_cache_blocks", "gauge", "Token blocks held by the prefix cache (RAM).", &|m| {
        m.prefix_cache_blocks as f64
    });
    put("prefix_cache_evictions_total", "counter", "Prefix-cache blocks evicted from RAM.", &|m| {
        m.prefix_cache_evictions as f64
    });
    put("prefix_cache_disk_bytes", "gauge", "Bytes held by the prefix cache's disk tier.", &|m| {
        m.prefix_cache_disk_bytes as f64
    });
    put("prefix_cache_disk_hits_total", "counter", "Prefix-cache blocks read back from disk.", &|m| {
        m.prefix_cache_disk_hits as f64
    });
    put(
        "prefix_cache_disk_write_skips_total",
        "counter",
        "Prefix-cache blocks not written to disk (queue full).",
        &|m| m.prefix_cache_disk_write_skips as f64,
    );
    let histograms: [(&str, &str, HistogramOf); 4] = [
        ("queue_wait_seconds", "Time finished requests waited before their prefill started.", |m| &m.queue_seconds),
        ("prefill_seconds", "Prefill time of finished requests (prefix-cache restore included).", |m| {
            &m.prefill_seconds
        }),
        ("time_to_first_token_seconds", "Arrival to first token of finished requests.", |m| &m.ttft_seconds),
        ("decode_seconds", "First token to the end of finished requests.", |m| &m.decode_seconds),
    ];
    for (name, help, of) in histograms {
        let _ = writeln!(out, "# HELP fastmlx_{name} {help}\n# TYPE fastmlx_{name} histogram");
        for (id, m) in &engines {
            let h = of(m);
            let model = label(id);
            let mut cumulative = 0;
            for (i, le) in LATENCY_BUCKETS.iter().map(|b| b.to_string()).chain(["+Inf".to_string()]).enumerate() {
                cumulative += h.counts[i];
                let _ = writeln!(out, "fastmlx_{name}_bucket{{model=\"{model}\",le=\"{le}\"}} {cumulative}");
            }
            let _ = writeln!(
                out,
                "fastmlx_{name}_sum{{model=\"{model}\"}} {}\nfastmlx_{name}_count{{model=\"{model}\"}} {}",
                h.sum, h.count
            );
        }
    }
    let waiting = state.models.awaited().map(|w| w.id);
    cluster_series(&mut out, &clusters, waiting.as_deref());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}

fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The series of models split across a cluster: each machine, each link as measured when it
/// formed, and what rank 0's steps through the pipeline cost (`up`: no rank lost); `waiting`:
/// a model whose cluster is forming (again), down.
fn cluster_series(out: &mut String, clusters: &[(String, ClusterStatus, bool)], waiting: Option<&str>) {
    if clusters.is_empty() && waiting.is_none() {
        return;
    }
    let head = |out: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP fastmlx_cluster_{name} {help}\n# TYPE fastmlx_cluster_{name} {kind}");
    };
    type Of = fn(&ClusterStatus) -> f64;
    head(out, "up", "gauge", "1 while every rank of the cluster is there, 0 once one is lost.");
    for (id, _, up) in clusters {
        let _ = writeln!(out, "fastmlx_cluster_up{{model=\"{}\"}} {}", label(id), u8::from(*up));
    }
    // Once per model: a lost cluster's model stays loaded until this process starts again.
    if let Some(id) = waiting.filter(|w| !clusters.iter().any(|(id, ..)| id == w)) {
        let _ = writeln!(out, "fastmlx_cluster_up{{model=\"{}\"}} 0", label(id));
    }
    if clusters.is_empty() {
        return;
    }
    let totals: [(&str, &str, &str, Of); 7] = [
        ("nodes", "gauge", "Machines the model is split across (1: served alone on rank 0).", |c| c.nodes.len() as f64),
        ("without", "gauge", "Machines of the host file the cluster serves without (gone past --drop-after).", |c| {
            c.without.len() as f64
        }),
        ("steps_total", "counter", "Engine steps run through the pipeline.", |c| c.steps as f64),
        ("tokens_total", "counter", "Token positions sent through the pipeline.", |c| c.tokens as f64),
        ("hop_bytes_total", "counter", "Bytes sent over each hop of the pipeline.", |c| c.bytes_per_hop as f64),
        ("wait_seconds_total", "counter", "Time rank 0 waited for the other ranks' layers and the hops.", |c| {
            c.wait_seconds
        }),
        ("step_seconds_total", "counter", "Time of whole steps on rank 0, the wait included.", |c| c.step_seconds),
    ];
    for (name, kind, help, of) in totals {
        head(out, name, kind, help);
        for (id, c, _) in clusters {
            let _ = writeln!(out, "fastmlx_cluster_{name}{{model=\"{}\"}} {}", label(id), of(c));
        }
    }
    type TimedOf = fn(&crate::engine::remote::TimedSteps) -> f64;
    let timed: [(&str, &str, TimedOf); 3] = [
        ("timed_steps_total", "By tensors: steps whose sums rank 0 timed apart from its layers.", |t| t.steps as f64),
        ("sum_seconds_total", "By tensors: time the timed steps spent in their sums.", |t| t.sum_seconds),
        ("timed_step_seconds_total", "By tensors: time of the timed steps in all.", |t| t.step_seconds),
    ];
    for (name, help, of) in timed {
        head(out, name, "counter", help);
        for (id, c, _) in clusters {
            for (kind, t) in [("prompt", &c.sums_timed.prompt), ("decode", &c.sums_timed.decode)] {
                let _ = writeln!(out, "fastmlx_cluster_{name}{{model=\"{}\",steps=\"{kind}\"}} {}", label(id), of(t));
            }
        }
    }
    head(out, "node_layers", "gauge", "Layers a machine holds.");
    for (id, c, _) in clusters {
        for n in &c.nodes {
            let (model, host) = (label(id), label(&n.host));
            let layers = n.end_layer - n.first_layer;
            let _ = writeln!(
                out,
                "fastmlx_cluster_node_layers{{model=\"{model}\",rank=\"{}\",host=\"{host}\"}} {layers}",
                n.rank
            );
        }
    }
    head(out, "node_room_bytes", "gauge", "The room a machine told for weights.");
    for (id, c, _) in clusters {
        for n in &c.nodes {
            let (model, host) = (label(id), label(&n.host));
            let _ = writeln!(
                out,
                "fastmlx_cluster_node_room_bytes{{model=\"{model}\",rank=\"{}\",host=\"{host}\"}} {}",
                n.rank, n.room_bytes
            );
        }
    }
    type OfLink = fn(&ClusterLink) -> f64;
    let links: [(&str, &str, OfLink); 2] = [
        ("link_round_trip_seconds", "A link's round trip, measured as the cluster formed.", |l| l.round_trip_ms / 1e3),
        ("link_bytes_per_second", "A link's throughput, measured as the cluster formed.", |l| {
            l.megabytes_per_second * 1e6
        }),
    ];
    for (name, help, of) in links {
        head(out, name, "gauge", help);
        for (id, c, _) in clusters {
            for l in &c.links {
                let _ = writeln!(
                    out,
                    "fastmlx_cluster_{name}{{model=\"{}\",from=\"{}\",to=\"{}\"}} {}",
                    label(id),
                    l.from,
                    l.to,
                    of(l)
                );
            }
        }
    }
}
