//! Real chat templates of the supported model families (tests/data/chat_templates, with their
//! sources) rendered by our minijinja environment, compared with what transformers renders for
//! the same conversations (cases.json, made by scripts/reference/chat_templates.py).

use std::path::Path;

use fastmlx::tokenizer::chat_template::RenderRequest;
use fastmlx::tokenizer::ChatTemplate;
use serde_json::Value;

mod common;

#[test]
fn renders_like_transformers() {
    let cases = common::read_json("tests/data/chat_templates/cases.json");
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 40);
    let dir = common::root().join("tests/data/chat_templates");
    let mut failures = Vec::new();
    for case in cases {
        let label = format!("{} / {}", case["template"].as_str().unwrap(), case["case"].as_str().unwrap());
        let source = std::fs::read_to_string(dir.join(Path::new(case["template"].as_str().unwrap()))).unwrap();
        let token = |k: &str| case[k].as_str().map(str::to_string);
        let template = ChatTemplate::new(&source, token("bos_token"), token("eos_token")).unwrap();
        let tools: Option<Vec<Value>> = case["tools"].as_array().cloned();
        let messages = case["messages"].as_array().unwrap();
        let request = RenderRequest {
            messages,
            tools: tools.as_deref(),
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            extra: case["extra"].as_object().cloned().unwrap_or_default(),
        };
        let result = template.render(&request).map(|r| any_today(&any_date(&r)));
        let expected = case["expected"].as_str().map(|e| any_today(&any_date(e)));
        match (expected.as_deref(), result) {
            (Some(expected), Ok(got)) if got == expected => {}
            (Some(expected), Ok(got)) => {
                failures.push(format!("{label}: rendered differently\n--- expected\n{expected}\n--- got\n{got}"))
            }
            (Some(_), Err(e)) => failures.push(format!("{label}: failed: {e}")),
            (None, Ok(got)) => failures.push(format!("{label}: should fail, rendered\n{got}")),
            (None, Err(e)) => {
                let want = case["expected_error_contains"].as_str().unwrap_or_default();
                if !e.to_string().contains(want) {
                    failures.push(format!("{label}: error {e:?} does not mention {want:?}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n\n{}", failures.len(), cases.len(), failures.join("\n\n"));
}

/// gpt-oss's template writes today's date: "Current date: YYYY-MM-DD" reads as any date.
fn any_date(text: &str) -> String {
    const LABEL: &str = "Current date: ";
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(LABEL) {
        let after = &rest[at + LABEL.len()..];
        let date_like = after.len() >= 10
            && after.as_bytes()[..10].iter().enumerate().all(|(i, b)| {
                if i == 4 || i == 7 {
                    *b == b'-'
                } else {
                    b.is_ascii_digit()
                }
            });
        out.push_str(&rest[..at + LABEL.len()]);
        if date_like {
            out.push_str("<date>");
            rest = &after[10..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// SmolLM3's template writes today's date when none is given: "Today Date: 06 December 2026"
/// (a day, a month's full name, a year) reads as any date. Dates a case passes in (Llama's
/// "26 Jul 2024") stay as they are.
fn any_today(text: &str) -> String {
    const LABEL: &str = "Today Date: ";
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(LABEL) {
        let after = &rest[at + LABEL.len()..];
        out.push_str(&rest[..at + LABEL.len()]);
        let words: Vec<&str> = after.splitn(4, [' ', '\n']).collect();
        let today = words.len() >= 3
            && words[0].len() == 2
            && words[0].bytes().all(|b| b.is_ascii_digit())
            && MONTHS.contains(&words[1])
            && words[2].len() >= 4
            && words[2][..4].bytes().all(|b| b.is_ascii_digit());
        if today {
            out.push_str("<today>");
            rest = &after[words[0].len() + 1 + words[1].len() + 1 + 4..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}
