//! Reasoning models (Qwen 3, DeepSeek R1 distills, QwQ) think inside `<think>...</think>` before
//! they answer (Gemma 4 inside `<|channel>thought\n...<channel|>`, special tokens); clients show
//! that part apart, from `reasoning_content`. The split happens while the text streams; a tag
//! cut across tokens is held back until it is whole.

/// The tags around a family's reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningTags {
    open: &'static str,
    /// A newline right after `open` is the format's, not the thought's.
    newline_after_open: bool,
    close: &'static str,
    /// Special tokens among the tags, whose text the engine must keep.
    special: &'static [&'static str],
}

const THINK: ReasoningTags =
    ReasoningTags { open: "<think>", newline_after_open: false, close: "</think>", special: &[] };
const GEMMA4: ReasoningTags = ReasoningTags {
    open: "<|channel>thought",
    newline_after_open: true,
    close: "<channel|>",
    special: &["<|channel>", "<channel|>"],
};

/// Seed-OSS thinks in its own tags (special tokens in its vocabulary, as far as we know).
const SEED: ReasoningTags = ReasoningTags {
    open: "<seed:think>",
    newline_after_open: false,
    close: "</seed:think>",
    special: &["<seed:think>", "</seed:think>"],
};

/// The tags a chat template closes its model's reasoning with, if any (Gemma 4's thought
/// channel, Seed-OSS's, else `<think>`).
pub fn tags_of(template: &str) -> Option<ReasoningTags> {
    [GEMMA4, SEED, THINK].into_iter().find(|t| template.contains(t.close))
}

impl ReasoningTags {
    /// The opening tag, as logs name the style.
    pub fn name(&self) -> &'static str {
        self.open
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Reasoning(String),
    Answer(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: `<think>` may still open.
    Start,
    /// Right after the opening tag, where the format may put a newline.
    Opened,
    Thinking,
    /// Right after `</think>`: the blank lines before the answer are dropped.
    AfterThinking,
    Answering,
}

pub struct ReasoningSplitter {
    tags: ReasoningTags,
    state: State,
    pending: String,
}

impl ReasoningSplitter {
    /// `<think>` tags; `thinking`: the prompt already opened one (templates that force reasoning).
    pub fn new(thinking: bool) -> ReasoningSplitter {
        ReasoningSplitter::with_tags(THINK, thinking)
    }

    fn with_tags(tags: ReasoningTags, thinking: bool) -> ReasoningSplitter {
        ReasoningSplitter { tags, state: if thinking { State::Thinking } else { State::Start }, pending: String::new() }
    }

    /// For an answer to `prompt`, which may already have opened a thought (templates that force
    /// reasoning).
    pub fn after_prompt(tags: ReasoningTags, prompt: &str) -> ReasoningSplitter {
        ReasoningSplitter::with_tags(tags, prompt.trim_end().ends_with(tags.open.trim_end()))
    }

    /// Special tokens the tags are made of (the engine keeps their text for this parser).
    pub fn special_tokens(&self) -> &'static [&'static str] {
        self.tags.special
    }

    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.pending.trim_start();
                    if let Some(thought) = trimmed.strip_prefix(self.tags.open) {
                        self.pending = thought.to_string();
                        self.state = if self.tags.newline_after_open { State::Opened } else { State::Thinking };
                    } else if trimmed.is_empty() || self.tags.open.starts_with(trimmed) {
                        return out;
                    } else {
                        self.state = State::Answering;
                    }
                }
                State::Opened => {
                    if self.pending.is_empty() {
                        return out;
                    }
                    if self.pending.starts_with('\n') {
                        self.pending.remove(0);
                    }
                    self.state = State::Thinking;
                }
                State::Thinking => {
                    let close = self.tags.close;
                    if let Some(end) = self.pending.find(close) {
                        let thought: String = self.pending.drain(..end + close.len()).collect();
                        push_part(&mut out, Part::Reasoning(thought[..end].to_string()));
                        self.state = State::AfterThinking;
                        continue;
                    }
                    let keep = partial_tag_len(&self.pending, close);
                    let emit: String = self.pending.drain(..self.pending.len() - keep).collect();
                    push_part(&mut out, Part::Reasoning(emit));
                    return out;
                }
                State::AfterThinking => {
                    let trimmed = self.pending.trim_start();
                    if trimmed.is_empty() {
                        self.pending.clear();
                        return out;
                    }
                    self.pending = trimmed.to_string();
                    self.state = State::Answering;
                }
                State::Answering => {
                    push_part(&mut out, Part::Answer(std::mem::take(&mut self.pending)));
                    return out;
                }
            }
        }
    }

    /// The end of the generation: what is held back (a lone `<thi`, say).
    pub fn finish(&mut self) -> Vec<Part> {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        match self.state {
            State::Opened | State::Thinking => push_part(&mut out, Part::Reasoning(rest)),
            State::AfterThinking => {}
            State::Start | State::Answering => push_part(&mut out, Part::Answer(rest)),
        }
        out
    }
}

fn push_part(out: &mut Vec<Part>, part: Part) {
    match &part {
        Part::Reasoning(t) | Part::Answer(t) if t.is_empty() => {}
        _ => out.push(part),
    }
}

/// The length of the longest suffix of `text` that begins `tag`.
fn partial_tag_len(text: &str, tag: &str) -> usize {
    (1..tag.len()).rev().filter(|&n| tag.is_char_boundary(n)).find(|&n| text.ends_with(&tag[..n])).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(thinking: bool, pieces: &[&str]) -> (String, String) {
        let mut s = ReasoningSplitter::new(thinking);
        let mut parts: Vec<Part> = pieces.iter().flat_map(|p| s.push(p)).collect();
        parts.extend(s.finish());
        let (mut reasoning, mut answer) = (String::new(), String::new());
        for part in parts {
            match part {
                Part::Reasoning(t) => reasoning.push_str(&t),
                Part::Answer(t) => answer.push_str(&t),
            }
        }
        (reasoning, answer)
    }

    #[test]
    fn think_block_split_across_tokens() {
        let (r, a) = run(false, &["<th", "ink>\nLet me", " see.</th", "ink>\n\n", "It is 4."]);
        assert_eq!((r.as_str(), a.as_str()), ("\nLet me see.", "It is 4."));
    }

    #[test]
    fn prompt_already_opened_the_block() {
        let (r, a) = run(true, &["2 + 2", " = 4</think>", "\n\nFour."]);
        assert_eq!((r.as_str(), a.as_str()), ("2 + 2 = 4", "Four."));
    }

    #[test]
    fn plain_answers_and_unfinished_thoughts() {
        assert_eq!(run(false, &["Hello ", "<think> is a tag"]), (String::new(), "Hello <think> is a tag".into()));
        assert_eq!(run(false, &["<think>still going"]), ("still going".into(), String::new()));
        assert_eq!(run(false, &["<thi"]), (String::new(), "<thi".into()));
    }

    /// A splitter for `template`'s tags after `prompt`.
    fn for_template(template: &str, prompt: &str) -> Option<ReasoningSplitter> {
        tags_of(template).map(|tags| ReasoningSplitter::after_prompt(tags, prompt))
    }

    #[test]
    fn templates_that_reason() {
        let qwen3 = "{{ '<think>' }}{{ '</think>' }}";
        assert!(for_template("{{ messages }}", "x").is_none());
        assert_eq!(for_template(qwen3, "<|im_start|>assistant\n").unwrap().state, State::Start);
        assert_eq!(for_template(qwen3, "<|im_start|>assistant\n<think>\n").unwrap().state, State::Thinking);
    }

    #[test]
    fn seed_oss_thinks_in_its_own_tags() {
        let template = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat_templates/seed-oss.jinja"),
        )
        .unwrap();
        let mut s = for_template(&template, "<seed:bos>assistant\n").unwrap();
        assert_eq!(s.special_tokens(), ["<seed:think>", "</seed:think>"]);
        let mut parts: Vec<Part> =
            ["<seed:th", "ink>Add them.</seed:", "think>", "4."].iter().flat_map(|p| s.push(p)).collect();
        parts.extend(s.finish());
        assert_eq!(parts, [Part::Reasoning("Add them.".into()), Part::Answer("4.".into())]);
    }

    #[test]
    fn gemma4_thought_channel() {
        let template = "{{ '<|channel>thought\\n<channel|>' }}";
        let mut s = for_template(template, "<|turn>model\n").unwrap();
        assert_eq!(s.special_tokens(), ["<|channel>", "<channel|>"]);
        let mut parts: Vec<Part> =
            ["<|chan", "nel>thought\nAdd", " them.<chan", "nel|>", "4."].iter().flat_map(|p| s.push(p)).collect();
        parts.extend(s.finish());
        assert_eq!(parts, [Part::Reasoning("Add".into()), Part::Reasoning(" them.".into()), Part::Answer("4.".into())]);
        // The newline after the opener is optional.
        let mut s = for_template(template, "<|turn>model\n").unwrap();
        let mut parts: Vec<Part> =
            ["<|channel>thought", "Sum.<channel|>", "4."].iter().flat_map(|p| s.push(p)).collect();
        parts.extend(s.finish());
        assert_eq!(parts, [Part::Reasoning("Sum.".into()), Part::Answer("4.".into())]);
        // With thinking off the prompt closes an empty thought: the answer is all answer.
        let mut s = for_template(template, "<|turn>model\n<|channel>thought\n<channel|>").unwrap();
        assert_eq!(s.state, State::Start);
        assert_eq!(s.push("Four."), [Part::Answer("Four.".into())]);
    }
}
