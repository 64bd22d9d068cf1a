//! Reasoning models (Qwen 3, DeepSeek R1 distills, QwQ) think inside `<think>...</think>` before
//! they answer; clients show that part apart, from `reasoning_content`. The split happens while
//! the text streams; a tag cut across tokens is held back until it is whole.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Reasoning(String),
    Answer(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: `<think>` may still open.
    Start,
    Thinking,
    /// Right after `</think>`: the blank lines before the answer are dropped.
    AfterThinking,
    Answering,
}

pub struct ReasoningSplitter {
    state: State,
    pending: String,
}

impl ReasoningSplitter {
    /// `thinking`: the prompt already opened `<think>` (templates that force reasoning).
    pub fn new(thinking: bool) -> ReasoningSplitter {
        ReasoningSplitter { state: if thinking { State::Thinking } else { State::Start }, pending: String::new() }
    }

    /// Whether a chat template's model reasons in `<think>` tags, and whether its rendered
    /// prompt leaves the model inside one.
    pub fn for_template(template_source: &str, prompt: &str) -> Option<ReasoningSplitter> {
        template_source.contains(CLOSE).then(|| ReasoningSplitter::new(prompt.trim_end().ends_with(OPEN)))
    }

    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.pending.trim_start();
                    if let Some(thought) = trimmed.strip_prefix(OPEN) {
                        self.pending = thought.to_string();
                        self.state = State::Thinking;
                    } else if trimmed.is_empty() || OPEN.starts_with(trimmed) {
                        return out;
                    } else {
                        self.state = State::Answering;
                    }
                }
                State::Thinking => {
                    if let Some(end) = self.pending.find(CLOSE) {
                        let thought: String = self.pending.drain(..end + CLOSE.len()).collect();
                        push_part(&mut out, Part::Reasoning(thought[..end].to_string()));
                        self.state = State::AfterThinking;
                        continue;
                    }
                    let keep = partial_tag_len(&self.pending, CLOSE);
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
            State::Thinking => push_part(&mut out, Part::Reasoning(rest)),
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
    (1..tag.len()).rev().find(|&n| text.ends_with(&tag[..n])).unwrap_or(0)
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

    #[test]
    fn templates_that_reason() {
        let qwen3 = "{{ '<think>' }}{{ '</think>' }}";
        assert!(ReasoningSplitter::for_template("{{ messages }}", "x").is_none());
        assert_eq!(ReasoningSplitter::for_template(qwen3, "<|im_start|>assistant\n").unwrap().state, State::Start);
        assert_eq!(
            ReasoningSplitter::for_template(qwen3, "<|im_start|>assistant\n<think>\n").unwrap().state,
            State::Thinking
        );
    }
}
