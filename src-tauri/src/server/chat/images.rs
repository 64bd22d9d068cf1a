//! Images in a chat request. Every dialect hands its images to the chat core as OpenAI's
//! `image_url` parts (Anthropic's base64 blocks and Ollama's bare base64 become data URLs); here
//! each is read from its data URL and checked from its header (format, declared type, size: no
//! pixel is decoded), and kept, in order, beside the messages.

use std::sync::Arc;

use base64::Engine as _;
use serde_json::Value;

use crate::model::vision::{inspect, ImageHeader, MediaType};
use crate::server::ApiError;

/// The most images one request may carry. Each becomes hundreds to thousands of prompt tokens
/// (a 1280 x 800 screenshot is 1,000 for Qwen3-VL): past this a request is a mistake or an attack.
pub const MAX_IMAGES: usize = 32;

/// One image of a request, checked.
#[derive(Debug, Clone)]
pub struct ImageInput {
    pub bytes: Arc<[u8]>,
    pub header: ImageHeader,
    /// Where it was in the request (`messages[2].content[1]`), for errors about it.
    pub param: String,
}

/// Reads an OpenAI `image_url` part: `{"type": "image_url", "image_url": {"url": ..}}` (or the
/// URL as a bare string, as some clients send it).
pub fn image_part(part: &Value, param: &str) -> Result<ImageInput, ApiError> {
    let url = match part.get("image_url") {
        Some(Value::String(url)) => url.as_str(),
        Some(Value::Object(o)) => o
            .get("url")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid(param, format!("{param}.image_url.url: field required")))?,
        _ => return Err(ApiError::invalid(param, format!("{param}.image_url: field required"))),
    };
    let (declared, bytes) = data_url(url, param)?;
    let header = inspect(&bytes, declared).map_err(|e| ApiError::invalid(param, format!("{param}: {e}")))?;
    Ok(ImageInput { bytes: bytes.into(), header, param: param.to_string() })
}

/// The media type (none when the URL does not say) and bytes of a `data:...;base64,...` URL.
fn data_url(url: &str, param: &str) -> Result<(Option<MediaType>, Vec<u8>), ApiError> {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        return Err(ApiError::invalid(
            param,
            format!(
                "{param}: image URLs are not fetched (a local server that fetches the URLs in requests lets any web \
                 page reach your network); send the image inline as a data URL (data:image/png;base64,...)"
            ),
        ));
    }
    let rest = url.strip_prefix("data:").ok_or_else(|| {
        ApiError::invalid(param, format!("{param}: an image must be a data URL (data:image/png;base64,...)"))
    })?;
    let (meta, data) = rest
        .split_once(',')
        .ok_or_else(|| ApiError::invalid(param, format!("{param}: a data URL needs a comma before its data")))?;
    let mut fields = meta.split(';');
    let mime = fields.next().unwrap_or_default().trim();
    if !fields.any(|f| f.trim().eq_ignore_ascii_case("base64")) {
        return Err(ApiError::invalid(param, format!("{param}: the image's data URL must be base64 (;base64,)")));
    }
    let declared = match mime {
        "" | "application/octet-stream" => None,
        mime => Some(MediaType::parse(mime).ok_or_else(|| {
            ApiError::invalid(param, format!("{param}: {mime} is not taken: images are PNG, JPEG, WebP or GIF"))
        })?),
    };
    // Line breaks and spaces are allowed in base64 data URLs (MIME style); a padding-less tail too.
    let compact: Vec<u8> = data.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let bytes = engine
        .decode(&compact)
        .map_err(|e| ApiError::invalid(param, format!("{param}: the image's base64 is invalid: {e}")))?;
    Ok((declared, bytes))
}

/// A message's content from OpenAI-shaped parts: the text joined when there is no image (as every
/// text-only message has always been), else the parts in order. What each dialect hands the core.
pub fn text_or_parts(parts: Vec<Value>) -> Value {
    if parts.iter().any(|p| p["type"] == "image_url" || p["type"] == "image") {
        return Value::Array(parts);
    }
    Value::String(parts.iter().filter_map(|p| p["text"].as_str()).collect())
}

/// An image as a data URL with its type unsaid (Ollama's images are bare base64).
pub fn bare_base64_url(data: &str) -> String {
    format!("data:;base64,{data}")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn png() -> Vec<u8> {
        let mut out = Vec::new();
        image::RgbImage::from_pixel(3, 2, image::Rgb([1, 2, 3]))
            .write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
            .unwrap();
        out
    }

    fn part(url: &str) -> Value {
        json!({"type": "image_url", "image_url": {"url": url}})
    }

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn a_data_url_is_read_and_checked() {
        let data = b64(&png());
        let image = image_part(&part(&format!("data:image/png;base64,{data}")), "messages[0].content[1]").unwrap();
        assert_eq!((image.header.width, image.header.height, image.header.media_type), (3, 2, MediaType::Png));
        // The URL as a bare string, no declared type, line-wrapped base64 without padding.
        let wrapped = format!("data:;base64,{}\n{}", &data[..10], data[10..].trim_end_matches('='));
        assert!(image_part(&json!({"type": "image_url", "image_url": wrapped}), "p").is_ok());
    }

    #[test]
    fn bad_images_are_refused_naming_the_part() {
        let data = b64(&png());
        let message = |url: &str| image_part(&part(url), "messages[1].content[0]").unwrap_err().message;
        assert!(message("https://example.com/cat.png").contains("not fetched"));
        assert!(message("file:///etc/passwd").contains("must be a data URL"));
        assert!(message(&format!("data:image/png,{data}")).contains("must be base64"));
        assert!(message(&format!("data:image/bmp;base64,{data}")).contains("image/bmp is not taken"));
        assert!(message(&format!("data:image/jpeg;base64,{data}")).contains("is image/png, not image/jpeg"));
        assert!(message("data:image/png;base64,@@@").contains("base64 is invalid"));
        assert!(message(&format!("data:image/png;base64,{}", b64(b"not an image"))).contains("not PNG, JPEG"));
        let err = image_part(&json!({"type": "image_url"}), "messages[1].content[0]").unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[1].content[0]"));
    }
}
