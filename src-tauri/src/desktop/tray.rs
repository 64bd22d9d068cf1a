//! The menu-bar menu as plain data: what it shows for a given state, and what each item does.
//! Building the native menu from this and running the actions is the thin Tauri part
//! (`app.rs`); everything decided here is unit-tested without a display.

/// What the menu reflects.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrayState {
    /// The API's URL while the server listens.
    pub url: Option<String>,
    /// The model requests go to by default (the most recently used loaded one).
    pub serving: Option<String>,
    /// Local chat models this build can load.
    pub models: Vec<String>,
    /// Local embedding models and rerankers, served beside the chat model.
    pub encoders: Vec<String>,
    /// Those of them loaded now.
    pub loaded_encoders: Vec<String>,
    /// A model being loaded from the menu.
    pub loading: Option<String>,
    /// Generated tokens per second, all models together.
    pub tokens_per_sec: f64,
    /// This Mac's rank of a cluster, started from the Server page (`cluster_launch`).
    pub cluster: Option<TrayCluster>,
}

/// What the menu says of this Mac's rank of a cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrayCluster {
    pub rank: usize,
    pub machines: usize,
    pub model: String,
    /// Why it ended, once it has.
    pub ended: Option<String>,
    /// What keeps it from serving (on rank 0, the lost machine, named).
    pub detail: Option<String>,
    /// Another rank's latest line of output (it has no server to ask).
    pub latest: Option<String>,
    /// Rank 0 serving: the machines it serves across now (fewer than `machines` while it
    /// serves without some).
    pub serving: Option<usize>,
    /// Rank 0: machines it serves without that are back, to be taken in.
    pub back: Vec<String>,
    /// Why rank 0 refused the latest Take Back Now, lately.
    pub refused: Option<String>,
}

impl TrayCluster {
    /// Rank 0 running: its child serves the API in the app's place.
    fn serves_api(&self) -> bool {
        self.rank == 0 && self.ended.is_none()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    ServeModel(String),
    OpenDashboard,
    /// The dashboard on its recommendations (Discover), for a first run with no model.
    ChooseModel,
    OpenChat,
    CopyApiUrl,
    ToggleServer,
    StopCluster,
    /// Rank 0: take the machines that are back in now.
    TakeBack,
    Quit,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// Shown, not clickable.
    Label(String),
    Model {
        id: String,
        checked: bool,
        loading: bool,
        /// Not while it loads, nor while a cluster serves the API in the app's place.
        enabled: bool,
    },
    Button {
        action: Action,
        label: String,
        enabled: bool,
    },
    Separator,
}

const MODEL_PREFIX: &str = "model:";

impl Action {
    /// The menu item id the native menu reports back.
    pub fn id(&self) -> String {
        match self {
            Action::ServeModel(model) => format!("{MODEL_PREFIX}{model}"),
            Action::OpenDashboard => "open-dashboard".into(),
            Action::ChooseModel => "choose-model".into(),
            Action::OpenChat => "open-chat".into(),
            Action::CopyApiUrl => "copy-api-url".into(),
            Action::ToggleServer => "toggle-server".into(),
            Action::StopCluster => "stop-cluster".into(),
            Action::TakeBack => "take-back".into(),
            Action::Quit => "quit".into(),
        }
    }

    /// The action of a clicked item id.
    pub fn from_id(id: &str) -> Option<Action> {
        if let Some(model) = id.strip_prefix(MODEL_PREFIX) {
            return (!model.is_empty()).then(|| Action::ServeModel(model.to_string()));
        }
        Some(match id {
            "open-dashboard" => Action::OpenDashboard,
            "choose-model" => Action::ChooseModel,
            "open-chat" => Action::OpenChat,
            "copy-api-url" => Action::CopyApiUrl,
            "toggle-server" => Action::ToggleServer,
            "stop-cluster" => Action::StopCluster,
            "take-back" => Action::TakeBack,
            "quit" => Action::Quit,
            _ => return None,
        })
    }
}

/// The first line: what is served where, and how fast.
pub fn status_line(state: &TrayState) -> String {
    match (&state.url, &state.serving) {
        (None, _) => "Server stopped".into(),
        (Some(url), None) => format!("No model loaded · {url}"),
        (Some(url), Some(model)) if state.tokens_per_sec >= 0.05 => {
            format!("{model} · {url} · {:.1} tok/s", state.tokens_per_sec)
        }
        (Some(url), Some(model)) => format!("{model} · {url}"),
    }
}

/// The whole menu, top to bottom.
pub fn menu(state: &TrayState) -> Vec<Item> {
    let mut items = vec![Item::Label(status_line(state))];
    if let Some(cluster) = &state.cluster {
        items.extend(cluster_items(cluster));
    }
    items.push(Item::Separator);
    let clustered = state.cluster.as_ref().is_some_and(TrayCluster::serves_api);
    if state.models.is_empty() && state.encoders.is_empty() {
        items.push(Item::Button {
            action: Action::ChooseModel,
            label: "No model yet – Choose one…".into(),
            enabled: true,
        });
    }
    for id in &state.models {
        let loading = state.loading.as_ref() == Some(id);
        items.push(Item::Model {
            id: id.clone(),
            checked: state.serving.as_ref() == Some(id),
            loading,
            enabled: !loading && !clustered,
        });
    }
    if !state.encoders.is_empty() {
        items.push(Item::Separator);
        items.push(Item::Label("Embeddings and reranking".into()));
        for id in &state.encoders {
            let loading = state.loading.as_ref() == Some(id);
            items.push(Item::Model {
                id: id.clone(),
                checked: state.loaded_encoders.contains(id),
                loading,
                enabled: !loading && !clustered,
            });
        }
    }
    let running = state.url.is_some();
    items.push(Item::Separator);
    items.push(Item::Button { action: Action::OpenDashboard, label: "Open Dashboard".into(), enabled: true });
    items.push(Item::Button { action: Action::OpenChat, label: "Open Chat".into(), enabled: running });
    items.push(Item::Button { action: Action::CopyApiUrl, label: "Copy API URL".into(), enabled: running });
    // While a cluster serves in the app's place, its own Stop Cluster stops that server.
    if !clustered {
        items.push(Item::Button {
            action: Action::ToggleServer,
            label: if running { "Stop Server" } else { "Start Server" }.into(),
            enabled: true,
        });
    }
    items.push(Item::Separator);
    items.push(Item::Button { action: Action::Quit, label: "Quit FastMLX".into(), enabled: true });
    items
}

/// Longest a line of the menu gets (a fault's text can run long), and most lines a reason gets.
const LONGEST: usize = 90;
const MOST_LINES: usize = 3;

/// The cluster's lines: what this Mac is in it, what is wrong (the machine lost, named), and a
/// way to stop it.
fn cluster_items(cluster: &TrayCluster) -> Vec<Item> {
    let mut items = vec![Item::Label(match (&cluster.ended, cluster.rank) {
        (Some(why), rank) => format!("Cluster stopped (this Mac was rank {rank}): {why}"),
        (None, 0) => match cluster.serving.filter(|&n| n < cluster.machines) {
            Some(1) => format!("Cluster: {} on this Mac alone, rank 0 of {}", cluster.model, cluster.machines),
            Some(n) => {
                format!("Cluster: {} across {n} of {} machines, this Mac rank 0", cluster.model, cluster.machines)
            }
            None => format!("Cluster: {} across {} machines, this Mac rank 0", cluster.model, cluster.machines),
        },
        (None, rank) => format!("Cluster: this Mac is rank {rank} of {} for {}", cluster.machines, cluster.model),
    })];
    // A reason reads "what happened; what it waits for now": a line each, so that neither is
    // cut off (the machine it waits for is named in the last).
    for clause in cluster.detail.iter().flat_map(|d| d.split("; ")).filter(|c| !c.is_empty()).take(MOST_LINES) {
        items.push(Item::Label(format!("⚠ {}", shortened(clause))));
    }
    if let Some(latest) = &cluster.latest {
        items.push(Item::Label(shortened(latest)));
    }
    if cluster.ended.is_none() && !cluster.back.is_empty() {
        items.push(Item::Label(shortened(&format!("{} back", cluster.back.join(", ")))));
        if let Some(why) = &cluster.refused {
            items.push(Item::Label(format!("⚠ {}", shortened(&format!("Not taken back: {why}")))));
        }
        items.push(Item::Button { action: Action::TakeBack, label: "Take Back Now".into(), enabled: true });
    }
    if cluster.ended.is_none() {
        items.push(Item::Button { action: Action::StopCluster, label: "Stop Cluster".into(), enabled: true });
    }
    items
}

fn shortened(text: &str) -> String {
    let mut line: String = text.chars().take(LONGEST).collect();
    if line.len() < text.len() {
        line.push('…');
    }
    line
}

/// A model's line: a check mark on the one serving, "loading…" while it loads.
pub fn model_label(id: &str, loading: bool) -> String {
    if loading {
        format!("{id} (loading…)")
    } else {
        id.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> TrayState {
        TrayState {
            url: Some("http://127.0.0.1:8080/v1".into()),
            serving: Some("a/one".into()),
            models: vec!["a/one".into(), "b/two".into()],
            encoders: vec![],
            loaded_encoders: vec![],
            loading: Some("b/two".into()),
            tokens_per_sec: 42.04,
            cluster: None,
        }
    }

    #[test]
    fn a_cluster_names_its_lost_machine_and_can_be_stopped() {
        let cause = "the cluster lost a rank: waiting for rank 1: [ring] connection to a peer was lost";
        let lost = "waiting for rank 1 (10.0.0.2:32323), not heard from for 12 s";
        let rank0 = TrayCluster {
            rank: 0,
            machines: 2,
            model: "a/one".into(),
            ended: None,
            detail: Some(format!("{cause}; {lost}")),
            latest: None,
            ..Default::default()
        };
        let items = menu(&TrayState { cluster: Some(rank0.clone()), loading: None, ..state() });
        assert_eq!(items[1], Item::Label("Cluster: a/one across 2 machines, this Mac rank 0".into()));
        assert_eq!(items[2], Item::Label(format!("⚠ {cause}")));
        assert_eq!(items[3], Item::Label(format!("⚠ {lost}")));
        assert_eq!(items[4], Item::Button { action: Action::StopCluster, label: "Stop Cluster".into(), enabled: true });
        // Its server is the cluster's: models cannot be loaded in the app meanwhile, nor the
        // server toggled (Stop Cluster is that).
        assert!(items.iter().all(|i| !matches!(i, Item::Model { enabled: true, .. })));
        assert!(items.iter().all(|i| !matches!(i, Item::Button { action: Action::ToggleServer, .. })));

        // Serving alone, then across 2 of 3, a machine back: it says so, and offers to take it in.
        let alone = TrayCluster { serving: Some(1), detail: None, ..rank0.clone() };
        let items = menu(&TrayState { cluster: Some(alone), loading: None, ..state() });
        assert_eq!(items[1], Item::Label("Cluster: a/one on this Mac alone, rank 0 of 2".into()));
        let back = vec!["rank 2 (10.0.0.3:32323)".to_string()];
        let fewer = TrayCluster { machines: 3, serving: Some(2), detail: None, back, ..rank0.clone() };
        let items = menu(&TrayState { cluster: Some(fewer.clone()), loading: None, ..state() });
        assert_eq!(items[1], Item::Label("Cluster: a/one across 2 of 3 machines, this Mac rank 0".into()));
        assert_eq!(items[2], Item::Label("rank 2 (10.0.0.3:32323) back".into()));
        assert_eq!(items[3], Item::Button { action: Action::TakeBack, label: "Take Back Now".into(), enabled: true });
        // A Take Back Now that rank 0 refused says why, above the button.
        let why = Some("the server is busy: 2 requests are running".to_string());
        let refused = TrayCluster { refused: why, ..fewer };
        let items = menu(&TrayState { cluster: Some(refused), loading: None, ..state() });
        assert_eq!(items[3], Item::Label("⚠ Not taken back: the server is busy: 2 requests are running".into()));
        assert_eq!(items[4], Item::Button { action: Action::TakeBack, label: "Take Back Now".into(), enabled: true });

        let long = "x".repeat(200);
        let worker = TrayCluster { rank: 1, detail: None, latest: Some(long), ..rank0.clone() };
        let items = menu(&TrayState { cluster: Some(worker), loading: None, ..state() });
        assert_eq!(items[1], Item::Label("Cluster: this Mac is rank 1 of 2 for a/one".into()));
        // Its latest line, not a warning.
        assert_eq!(items[2], Item::Label(format!("{}…", "x".repeat(90))));
        assert!(
            items.iter().any(|i| matches!(i, Item::Model { enabled: true, .. })),
            "a worker's app serves as before"
        );
        assert!(items.iter().any(|i| matches!(i, Item::Button { action: Action::ToggleServer, .. })));

        let ended = TrayCluster { ended: Some("it ended with exit code 1".into()), detail: None, ..rank0 };
        let items = menu(&TrayState { cluster: Some(ended), ..state() });
        assert_eq!(items[1], Item::Label("Cluster stopped (this Mac was rank 0): it ended with exit code 1".into()));
        assert_eq!(items[2], Item::Separator);
        assert!(items.iter().all(|i| !matches!(i, Item::Button { action: Action::StopCluster, .. })));
    }

    #[test]
    fn embedding_models_are_listed_apart_and_checked_when_loaded() {
        let with = TrayState {
            encoders: vec!["minilm".into(), "reranker".into()],
            loaded_encoders: vec!["minilm".into()],
            ..state()
        };
        let items = menu(&with);
        let at = items.iter().position(|i| *i == Item::Label("Embeddings and reranking".into())).unwrap();
        assert_eq!(items[at - 1], Item::Separator);
        assert_eq!(items[at + 1], Item::Model { id: "minilm".into(), checked: true, loading: false, enabled: true });
        assert_eq!(items[at + 2], Item::Model { id: "reranker".into(), checked: false, loading: false, enabled: true });
        // The chat model stays the checked one above them.
        assert_eq!(items[2], Item::Model { id: "a/one".into(), checked: true, loading: false, enabled: true });
    }

    #[test]
    fn menu_lists_models_with_the_serving_one_checked() {
        let items = menu(&state());
        assert_eq!(items[0], Item::Label("a/one · http://127.0.0.1:8080/v1 · 42.0 tok/s".into()));
        assert_eq!(items[2], Item::Model { id: "a/one".into(), checked: true, loading: false, enabled: true });
        assert_eq!(items[3], Item::Model { id: "b/two".into(), checked: false, loading: true, enabled: false });
        assert_eq!(model_label("b/two", true), "b/two (loading…)");
        let labels: Vec<&str> = items
            .iter()
            .filter_map(|i| if let Item::Button { label, .. } = i { Some(label.as_str()) } else { None })
            .collect();
        assert_eq!(labels, ["Open Dashboard", "Open Chat", "Copy API URL", "Stop Server", "Quit FastMLX"]);
    }

    #[test]
    fn stopped_server_disables_chat_and_copy() {
        let stopped = TrayState { url: None, ..state() };
        let items = menu(&stopped);
        assert_eq!(items[0], Item::Label("Server stopped".into()));
        let enabled = |action: Action| {
            items.iter().any(|i| matches!(i, Item::Button { action: a, enabled: true, .. } if *a == action))
        };
        assert!(!enabled(Action::OpenChat) && !enabled(Action::CopyApiUrl) && enabled(Action::OpenDashboard));
        assert!(items.iter().any(|i| matches!(i, Item::Button { label, .. } if label == "Start Server")));
        let empty = menu(&TrayState { models: vec![], serving: None, ..state() });
        assert_eq!(empty[0], Item::Label("No model loaded · http://127.0.0.1:8080/v1".into()));
        assert_eq!(
            empty[2],
            Item::Button { action: Action::ChooseModel, label: "No model yet – Choose one…".into(), enabled: true }
        );
    }

    #[test]
    fn ids_round_trip_to_actions() {
        for action in [
            Action::ServeModel("org/m:q4".into()),
            Action::OpenDashboard,
            Action::ChooseModel,
            Action::OpenChat,
            Action::CopyApiUrl,
            Action::ToggleServer,
            Action::StopCluster,
            Action::TakeBack,
            Action::Quit,
        ] {
            assert_eq!(Action::from_id(&action.id()), Some(action));
        }
        assert_eq!(Action::from_id("model:"), None);
        assert_eq!(Action::from_id("something-else"), None);
    }
}
