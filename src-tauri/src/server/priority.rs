//! A request's priority, from the client: vLLM's `priority` field in the OpenAI dialects and an
//! `X-Priority` header in every dialect, both with vLLM's meaning (lower runs sooner, default
//! 0). Fill-in-the-middle requests (autocomplete) go in the interactive lane unless they say
//! otherwise. The engine's scale runs the other way (higher first), hence the sign.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::ApiError;
use crate::engine::lanes::INTERACTIVE;

/// How far a client may push a request either way.
const LIMIT: i32 = 1000;

/// `X-Priority`, when the request has one.
pub struct HeaderPriority(pub Option<i32>);

impl<S: Send + Sync> FromRequestParts<S> for HeaderPriority {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let Some(value) = parts.headers.get("x-priority") else { return Ok(HeaderPriority(None)) };
        let text = value.to_str().unwrap_or_default().trim();
        let parsed = text.parse::<i32>().ok().filter(|p| p.abs() <= LIMIT);
        parsed.map(|p| HeaderPriority(Some(p))).ok_or_else(|| {
            ApiError::invalid(
                "X-Priority",
                format!("X-Priority must be an integer from -{LIMIT} to {LIMIT} (lower runs sooner)"),
            )
        })
    }
}

/// The engine's priority for a client's (`priority` field, else the header), FIM requests
/// interactive by default.
pub fn engine_priority(field: Option<i64>, header: Option<i32>, fill_in_the_middle: bool) -> Result<i32, ApiError> {
    let field = match field {
        Some(p) if p.abs() <= i64::from(LIMIT) => Some(p as i32),
        Some(_) => {
            return Err(ApiError::invalid(
                "priority",
                format!("priority must be from -{LIMIT} to {LIMIT} (lower runs sooner)"),
            ))
        }
        None => None,
    };
    Ok(match field.or(header) {
        Some(p) => -p,
        None if fill_in_the_middle => INTERACTIVE,
        None => 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_is_sooner_and_fim_is_interactive() {
        assert_eq!(engine_priority(None, None, false).unwrap(), 0);
        assert_eq!(engine_priority(Some(-5), Some(9), false).unwrap(), 5, "the field wins over the header");
        assert_eq!(engine_priority(None, Some(3), false).unwrap(), -3);
        assert_eq!(engine_priority(None, None, true).unwrap(), INTERACTIVE);
        assert_eq!(engine_priority(None, Some(0), true).unwrap(), 0, "a FIM request may ask for the normal lane");
        assert_eq!(engine_priority(Some(1 << 40), None, false).unwrap_err().param.as_deref(), Some("priority"));
    }
}
