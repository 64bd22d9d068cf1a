//! The models Discover opens on: a curated list kept in the repository as data
//! (`recommended.json`), each model with its quantizations, and for each what it would take and
//! serve on *this* machine by the store's own cost model (the memory governor's planner, as for
//! a model on disk). The list carries each model's `config.json`, so it works offline: only the
//! download needs the Hub. `FASTMLX_RECOMMENDED` names another file of the same form.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::fit::{fit, memory_needed, plan_from};
use crate::engine::memory::{Fit, ServingPlan};
use crate::model::encoder::{encoder_shape, is_encoder_config};

const BUILTIN: &str = include_str!("recommended.json");

/// A model's stated size and its config's count may differ by this much (embeddings counted
/// or not, a vision tower published beside the text model).
const SIZE_TOLERANCE: f64 = 0.15;

#[derive(Debug, Clone, Deserialize)]
pub struct RecommendedList {
    pub version: u32,
    pub updated: String,
    pub uses: Vec<Use>,
    pub models: Vec<Recommended>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Use {
    pub id: String,
    pub title: String,
    #[serde(default)]
    pub blurb: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Chat,
    Embedding,
    Reranker,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Recommended {
    pub name: String,
    pub uses: Vec<String>,
    pub kind: Kind,
    /// The published size, in billions.
    pub parameters_b: f64,
    #[serde(default)]
    pub summary: String,
    pub config: Value,
    pub quantizations: Vec<Quantization>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Quantization {
    pub repo: String,
    pub label: String,
    /// Stored bits per parameter, scales included.
    pub bits_per_weight: f64,
}

/// The shape a recommended model's config gives: what the estimates need.
struct Shape {
    parameters: u64,
    max_context: usize,
    model_type: String,
    /// Chat models only: the planner's input.
    config: Option<crate::model::ModelConfig>,
}

impl Recommended {
    fn shape(&self, origin: &Path) -> Result<Shape, String> {
        let model_type = self.config.get("model_type").and_then(Value::as_str).unwrap_or_default().to_string();
        if is_encoder_config(&self.config) {
            if self.kind == Kind::Chat {
                return Err(format!("{}: an encoder ({model_type}) cannot be a chat model", self.name));
            }
            let (parameters, max_context) = encoder_shape(&self.config, origin).map_err(|e| e.to_string())?;
            return Ok(Shape { parameters, max_context, model_type, config: None });
        }
        let config = crate::model::config_from_json(&self.config, origin).map_err(|e| e.to_string())?;
        let (parameters, max_context) = (config.parameter_count(), config.max_position_embeddings);
        let config = (self.kind == Kind::Chat).then_some(config);
        Ok(Shape { parameters, max_context, model_type, config })
    }
}

impl RecommendedList {
    /// The list shipped with this build.
    pub fn builtin() -> RecommendedList {
        RecommendedList::parse(BUILTIN, Path::new("recommended.json"))
            .expect("the shipped list is checked by its tests")
    }

    /// `FASTMLX_RECOMMENDED`'s file when set, else the shipped list.
    pub fn from_env() -> Result<RecommendedList, String> {
        match std::env::var_os("FASTMLX_RECOMMENDED").filter(|p| !p.is_empty()) {
            Some(path) => RecommendedList::read(&PathBuf::from(path)),
            None => Ok(RecommendedList::builtin()),
        }
    }

    pub fn read(path: &Path) -> Result<RecommendedList, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        RecommendedList::parse(&text, path)
    }

    /// Parses and checks a list: every use named exists, every repo is `org/name`, every config
    /// is one FastMLX loads.
    pub fn parse(text: &str, path: &Path) -> Result<RecommendedList, String> {
        let list: RecommendedList = serde_json::from_str(text).map_err(|e| format!("{}: {e}", path.display()))?;
        let uses: HashSet<&str> = list.uses.iter().map(|u| u.id.as_str()).collect();
        for model in &list.models {
            let bad = |message: String| format!("{}: {}: {message}", path.display(), model.name);
            if let Some(unknown) = model.uses.iter().find(|u| !uses.contains(u.as_str())) {
                return Err(bad(format!("use {unknown:?} is not among the list's uses")));
            }
            if model.quantizations.is_empty() {
                return Err(bad("no quantization to download".into()));
            }
            for q in &model.quantizations {
                let parts: Vec<&str> = q.repo.split('/').collect();
                if parts.len() != 2 || parts.iter().any(|p| p.is_empty() || *p == "." || *p == "..") {
                    return Err(bad(format!("repo {:?} is not a Hugging Face id (org/name)", q.repo)));
                }
                if !(1.0..=32.0).contains(&q.bits_per_weight) {
                    return Err(bad(format!("{}: bits_per_weight {} is not 1 to 32", q.repo, q.bits_per_weight)));
                }
            }
            model.shape(&path.join(&model.name)).map_err(&bad)?;
        }
        Ok(list)
    }

    /// The entries whose config disagrees with the size they state (`parameters_b`, the
    /// published figure): a config copied wrong. The shipped list's tests require none.
    pub fn size_mismatches(&self) -> Vec<String> {
        self.models
            .iter()
            .filter_map(|model| {
                let counted = model.shape(Path::new(&model.name)).ok()?.parameters as f64;
                let stated = model.parameters_b * 1e9;
                ((counted - stated).abs() > SIZE_TOLERANCE * stated).then(|| {
                    format!(
                        "{}: its config counts {:.2}B parameters, the entry says {}B",
                        model.name,
                        counted / 1e9,
                        model.parameters_b
                    )
                })
            })
            .collect()
    }

    /// The list as it stands on this machine: each quantization's estimate under `ceiling`
    /// (an engine batching `max_batch` rows), which are on disk already (`local` ids), and per
    /// use the models sorted so the best one that fits comes first.
    pub fn for_this_machine(&self, ceiling: u64, max_batch: usize, local: &HashSet<String>) -> ForThisMachine {
        let views: Vec<ModelView> = self.models.iter().map(|m| view(m, ceiling, max_batch, local)).collect();
        let uses = self
            .uses
            .iter()
            .map(|u| {
                let mut models: Vec<&ModelView> = views.iter().filter(|v| v.uses.contains(&u.id)).collect();
                // Stable: the curated order within each badge.
                models.sort_by_key(|v| fit_rank(v.fit));
                UseView { info: u.clone(), models: models.into_iter().cloned().collect() }
            })
            .collect();
        ForThisMachine { version: self.version, updated: self.updated.clone(), ceiling_bytes: ceiling, uses }
    }
}

fn fit_rank(fit: Option<Fit>) -> u8 {
    match fit {
        Some(Fit::Fits) => 0,
        Some(Fit::Tight) => 1,
        Some(Fit::TooBig) => 2,
        None => 3,
    }
}

fn fit_of(name: &str) -> Fit {
    match name {
        "fits" => Fit::Fits,
        "tight" => Fit::Tight,
        _ => Fit::TooBig,
    }
}

fn view(model: &Recommended, ceiling: u64, max_batch: usize, local: &HashSet<String>) -> ModelView {
    let shape = model.shape(Path::new(&model.name)).ok();
    let quantizations: Vec<QuantView> = model
        .quantizations
        .iter()
        .map(|q| {
            let weights = shape.as_ref().map(|s| (s.parameters as f64 * q.bits_per_weight / 8.0) as u64);
            let plan = shape
                .as_ref()
                .and_then(|s| s.config.as_ref())
                .zip(weights)
                .map(|(config, weights)| plan_from(config, weights, ceiling, max_batch));
            let needed = weights.map(memory_needed);
            let fit = plan.as_ref().map(|p| p.fit).or(needed.map(|n| fit_of(fit(n, ceiling))));
            QuantView {
                repo: q.repo.clone(),
                label: q.label.clone(),
                weights_bytes: weights,
                memory_needed_bytes: needed,
                fit,
                plan,
                downloaded: local.contains(&q.repo),
            }
        })
        .collect();
    // The one to offer: the first (the list puts the better ones first) with the best badge.
    let choice = (0..quantizations.len()).min_by_key(|&i| (fit_rank(quantizations[i].fit), i)).unwrap_or(0);
    ModelView {
        name: model.name.clone(),
        kind: model.kind,
        summary: model.summary.clone(),
        uses: model.uses.clone(),
        model_type: shape.as_ref().map(|s| s.model_type.clone()),
        parameters: shape.as_ref().map(|s| s.parameters),
        max_context: shape.as_ref().map(|s| s.max_context),
        fit: quantizations.get(choice).and_then(|q| q.fit),
        choice,
        quantizations,
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ForThisMachine {
    pub version: u32,
    pub updated: String,
    pub ceiling_bytes: u64,
    pub uses: Vec<UseView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct UseView {
    #[serde(flatten)]
    pub info: Use,
    pub models: Vec<ModelView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelView {
    pub name: String,
    pub kind: Kind,
    pub summary: String,
    pub uses: Vec<String>,
    pub model_type: Option<String>,
    pub parameters: Option<u64>,
    pub max_context: Option<usize>,
    /// The badge of the quantization offered.
    pub fit: Option<Fit>,
    /// Which quantization is offered: the best that fits here.
    pub choice: usize,
    pub quantizations: Vec<QuantView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct QuantView {
    pub repo: String,
    pub label: String,
    pub weights_bytes: Option<u64>,
    pub memory_needed_bytes: Option<u64>,
    pub fit: Option<Fit>,
    /// Chat models: the context four requests get here, with and without KV quantization.
    pub plan: Option<ServingPlan>,
    /// On disk already (served with one click, no download).
    pub downloaded: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1 << 30;

    #[test]
    fn the_shipped_list_parses_and_every_config_agrees_with_its_size() {
        let list = RecommendedList::parse(BUILTIN, Path::new("recommended.json")).unwrap();
        assert_eq!(list.size_mismatches(), Vec::<String>::new());
        assert!(list.models.len() >= 10, "a list worth opening on");
        for use_ in &list.uses {
            assert!(list.models.iter().any(|m| m.uses.contains(&use_.id)), "{} has models", use_.id);
        }
        for kind in [Kind::Chat, Kind::Embedding, Kind::Reranker] {
            assert!(list.models.iter().any(|m| m.kind == kind), "{kind:?} recommended");
        }
    }

    #[test]
    fn a_list_that_contradicts_itself_is_caught_with_the_reason() {
        let mut raw: Value = serde_json::from_str(BUILTIN).unwrap();
        raw["models"][0]["parameters_b"] = Value::from(3.0);
        let wrong = RecommendedList::parse(&raw.to_string(), Path::new("mine.json")).unwrap().size_mismatches();
        assert_eq!(wrong.len(), 1, "{wrong:?}");
        assert!(wrong[0].contains("the entry says 3B"), "{wrong:?}");

        let mut raw: Value = serde_json::from_str(BUILTIN).unwrap();
        raw["models"][0]["uses"] = serde_json::json!(["poetry"]);
        let err = RecommendedList::parse(&raw.to_string(), Path::new("mine.json")).unwrap_err();
        assert!(err.contains("mine.json") && err.contains("\"poetry\""), "{err}");

        let mut raw: Value = serde_json::from_str(BUILTIN).unwrap();
        raw["models"][0]["quantizations"][0]["repo"] = Value::from("../etc");
        let err = RecommendedList::parse(&raw.to_string(), Path::new("mine.json")).unwrap_err();
        assert!(err.contains("not a Hugging Face id"), "{err}");

        let mut raw: Value = serde_json::from_str(BUILTIN).unwrap();
        raw["models"][0]["config"]["model_type"] = Value::from("whisper");
        assert!(RecommendedList::parse(&raw.to_string(), Path::new("mine.json")).is_err());
    }

    /// The estimates follow the machine: the best model that fits leads each use, and the
    /// quantization offered is the best one that fits.
    #[test]
    fn the_best_model_that_fits_comes_first() {
        let list = RecommendedList::builtin();
        let local = HashSet::from(["mlx-community/Qwen3-4B-Instruct-2507-4bit".to_string()]);
        let ranks = |m: &ModelView| fit_rank(m.fit);
        for ceiling in [6 * GB, 16 * GB, 45 * GB, 90 * GB, 400 * GB] {
            let here = list.for_this_machine(ceiling, 32, &local);
            for use_ in &here.uses {
                let badges: Vec<u8> = use_.models.iter().map(ranks).collect();
                assert!(badges.windows(2).all(|w| w[0] <= w[1]), "{} at {ceiling}: {badges:?}", use_.info.id);
            }
        }
        // On this CPU the keys and values are f32 (on Metal, 16 bits): an 8 GB Mac's ceiling
        // (about 6 GB) fits nothing an agent needs; 16 GB fits the small models with 8k+ tokens.
        let tiny = list.for_this_machine(6 * GB, 32, &local);
        let coding = tiny.uses.iter().find(|u| u.info.id == "coding").unwrap();
        assert!(coding.models.iter().all(|m| m.fit == Some(Fit::TooBig)), "nothing for agents fits 6 GB");
        let small = list.for_this_machine(16 * GB, 32, &local);
        let smalls = small.uses.iter().find(|u| u.info.id == "small").unwrap();
        assert_eq!(smalls.models[0].fit, Some(Fit::Fits));
        let qwen4b = smalls.models.iter().find(|m| m.name.starts_with("Qwen3 4B")).unwrap();
        assert!(qwen4b.quantizations[0].downloaded);
        let plan = qwen4b.quantizations[0].plan.as_ref().expect("a chat model gets a plan");
        assert!(plan.context_tokens >= 8192, "{plan:?}");
        assert!(plan.context_tokens_kv4.unwrap() > plan.context_tokens, "4-bit KV holds more");

        // A 64 GB Mac (45 GB for models): the 8-bit coder is offered over the 4-bit one; on 36 GB
        // (25 GB), the 4-bit.
        let offered = |ceiling: u64| {
            let here = list.for_this_machine(ceiling, 32, &HashSet::new());
            let coding = here.uses.into_iter().find(|u| u.info.id == "coding").unwrap();
            let coder = coding.models.into_iter().find(|m| m.name.starts_with("Qwen3-Coder 30B")).unwrap();
            (coder.quantizations[coder.choice].label.clone(), coder.fit)
        };
        assert_eq!(offered(45 * GB), ("8-bit".to_string(), Some(Fit::Fits)));
        assert_eq!(offered(25 * GB), ("4-bit".to_string(), Some(Fit::Fits)));
        // Embedding models are judged by size alone (no context plan).
        let embed = small.uses.iter().find(|u| u.info.id == "embeddings").unwrap();
        assert!(embed.models.iter().all(|m| m.fit == Some(Fit::Fits) && m.quantizations[0].plan.is_none()));
    }
}
