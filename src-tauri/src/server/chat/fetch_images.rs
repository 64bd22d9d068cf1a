//! `--fetch-image-urls`: a request's `http(s)` image URLs fetched and put inline as data URLs
//! before the chat core reads them. Off by default: a local server that fetches the URLs in
//! requests lets any web page that can reach it make requests inside your network (SSRF); a
//! person who serves only their own tools may turn it on.

use std::time::Duration;

use base64::Engine as _;
use futures_util::StreamExt;
use serde_json::Value;

use super::images::MAX_IMAGES;
use crate::server::ApiError;

/// Per image, as the chat window's limit; a larger body is refused as it arrives.
const MAX_IMAGE_BYTES: usize = 20 << 20;
const TIMEOUT: Duration = Duration::from_secs(15);

/// The messages with every `http(s)` image URL replaced by the image as a data URL; `None` when
/// none has one.
pub async fn inline_image_urls(messages: &[Value]) -> Result<Option<Vec<Value>>, ApiError> {
    let mut urls = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        collect(message, &format!("messages[{i}]"), &mut urls);
    }
    if urls.is_empty() {
        return Ok(None);
    }
    if urls.len() > MAX_IMAGES {
        return Err(ApiError::invalid(
            "messages",
            format!("{} images in one request: at most {MAX_IMAGES}", urls.len()),
        ));
    }
    let client = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .redirect(reqwest::redirect::Policy::limited(3))
        .build()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let mut messages = messages.to_vec();
    for (param, url) in urls {
        let data = fetch(&client, &url, &param).await?;
        messages.iter_mut().for_each(|m| replace(m, &url, &data));
    }
    Ok(Some(messages))
}

/// Every `image_url` part with an `http(s)` URL under `value`, with where it is.
fn collect(value: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(o) => {
            if o.get("type").and_then(Value::as_str) == Some("image_url") {
                if let Some(url) = image_url(value).filter(|u| is_http(u)) {
                    out.push((at.to_string(), url.to_string()));
                }
            }
            for (key, v) in o {
                collect(v, &format!("{at}.{key}"), out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                collect(v, &format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn image_url(part: &Value) -> Option<&str> {
    match part.get("image_url")? {
        Value::String(url) => Some(url),
        Value::Object(o) => o.get("url")?.as_str(),
        _ => None,
    }
}

fn is_http(url: &str) -> bool {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://")
}

/// Every `image_url` part whose URL is `url` takes `data` instead.
fn replace(value: &mut Value, url: &str, data: &str) {
    match value {
        Value::Object(o) => {
            let part_url = match o.get("image_url") {
                Some(Value::String(u)) => Some(u.as_str()),
                Some(Value::Object(i)) => i.get("url").and_then(Value::as_str),
                _ => None,
            };
            if o.get("type").and_then(Value::as_str) == Some("image_url") && part_url == Some(url) {
                o.insert("image_url".into(), serde_json::json!({"url": data}));
            }
            o.values_mut().for_each(|v| replace(v, url, data));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| replace(v, url, data)),
        _ => {}
    }
}

/// The image at `url` as a data URL (its type as the server says, checked later against its bytes).
async fn fetch(client: &reqwest::Client, url: &str, param: &str) -> Result<String, ApiError> {
    let fail =
        |why: String| ApiError::invalid(param, format!("{param}: the image at {url} could not be fetched: {why}"));
    let response = client.get(url).send().await.map_err(|e| fail(e.to_string()))?;
    if !response.status().is_success() {
        return Err(fail(format!("the server answered {}", response.status())));
    }
    if response.content_length().is_some_and(|n| n as usize > MAX_IMAGE_BYTES) {
        return Err(fail("larger than 20 MB".into()));
    }
    let mime = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or_default().trim().to_ascii_lowercase())
        .filter(|m| m.starts_with("image/"))
        .unwrap_or_default();
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        body.extend_from_slice(&chunk.map_err(|e| fail(e.to_string()))?);
        if body.len() > MAX_IMAGE_BYTES {
            return Err(fail("larger than 20 MB".into()));
        }
    }
    Ok(format!("data:{mime};base64,{}", base64::engine::general_purpose::STANDARD.encode(&body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_image_parts_are_found_wherever_they_sit_and_replaced() {
        let mut messages = [serde_json::json!({"role": "user", "content": [
            {"type": "text", "text": "Compare"},
            {"type": "image_url", "image_url": {"url": "https://a.test/x.png"}},
            {"type": "image_url", "image_url": "http://b.test/y.png"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ]})];
        let mut found = Vec::new();
        collect(&messages[0], "messages[0]", &mut found);
        assert_eq!(
            found,
            [
                ("messages[0].content[1]".to_string(), "https://a.test/x.png".to_string()),
                ("messages[0].content[2]".to_string(), "http://b.test/y.png".to_string())
            ]
        );
        replace(&mut messages[0], "http://b.test/y.png", "data:image/png;base64,BBBB");
        assert_eq!(messages[0]["content"][2]["image_url"]["url"], "data:image/png;base64,BBBB");
        assert_eq!(messages[0]["content"][1]["image_url"]["url"], "https://a.test/x.png");
    }
}
