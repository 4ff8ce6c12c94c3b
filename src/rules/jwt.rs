//! Verifying a request's JSON Web Token (`[jwt]`): the claims of a token whose signature,
//! algorithm, expiry, issuer and audience all check out, or why it was rejected. A
//! rejected token never yields a claim: the parts made of it are missing.

use std::sync::Mutex;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Validation, decode, decode_header};

use crate::config::{JwtConfig, KeySet};

/// A verified token's claims.
pub type Claims = serde_json::Map<String, serde_json::Value>;

/// Why a token was not believed (`ratemesh_identity_rejected_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Longer than `max_token_bytes`.
    TooLarge,
    /// Not a JWT (its shape, base64, JSON or header).
    Malformed,
    /// Signed with an algorithm the file does not allow (`none` included).
    AlgNotAllowed,
    /// Its `kid` names no key of the JWKS (or it has none and the JWKS has several).
    UnknownKid,
    /// The signature does not verify.
    BadSignature,
    /// `exp` has passed (beyond the leeway), or is absent.
    Expired,
    /// `nbf` has not come yet.
    NotYetValid,
    /// `iss` is not a configured issuer.
    WrongIssuer,
    /// `aud` is not a configured audience.
    WrongAudience,
}

impl Rejection {
    /// The reason's label.
    pub fn label(self) -> &'static str {
        match self {
            Rejection::TooLarge => "too_large",
            Rejection::Malformed => "malformed",
            Rejection::AlgNotAllowed => "alg_not_allowed",
            Rejection::UnknownKid => "unknown_kid",
            Rejection::BadSignature => "bad_signature",
            Rejection::Expired => "expired",
            Rejection::NotYetValid => "not_yet_valid",
            Rejection::WrongIssuer => "wrong_issuer",
            Rejection::WrongAudience => "wrong_audience",
        }
    }
}

/// The configured verification with its keys (swapped when the key file changes).
pub(super) struct JwtVerifier {
    config: JwtConfig,
    keys: ArcSwap<KeySet>,
    /// The key file's modification time when last read.
    read_at: Mutex<Option<SystemTime>>,
}

fn modified(config: &JwtConfig) -> Option<SystemTime> {
    std::fs::metadata(config.keys.path())
        .and_then(|m| m.modified())
        .ok()
}

impl JwtVerifier {
    pub(super) fn new(config: &JwtConfig) -> Result<Self, String> {
        let read_at = modified(config);
        let keys = config.load_keys()?;
        Ok(JwtVerifier {
            config: config.clone(),
            keys: ArcSwap::from_pointee(keys),
            read_at: Mutex::new(read_at),
        })
    }

    /// Read the key file again if it changed since it was last read; return whether the
    /// keys changed. A file that no longer loads keeps the keys in force (the error says
    /// why).
    pub(super) fn refresh(&self) -> Result<bool, String> {
        let now = modified(&self.config);
        let mut read_at = self.read_at.lock().unwrap_or_else(|e| e.into_inner());
        if now == *read_at {
            return Ok(false);
        }
        let keys = self.config.load_keys()?;
        self.keys.store(std::sync::Arc::new(keys));
        *read_at = now;
        Ok(true)
    }

    /// The claims of the token in `headers`: `None` without a token.
    pub(super) fn verify(&self, headers: &http::HeaderMap) -> Option<Result<Claims, Rejection>> {
        let value = headers.get(&self.config.header)?.as_bytes();
        let token = if self.config.header == http::header::AUTHORIZATION {
            match value.get(..7) {
                Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => &value[7..],
                // Another scheme (Basic, …): no token here.
                _ => return None,
            }
        } else {
            value
        }
        .trim_ascii();
        if token.is_empty() {
            return None;
        }
        Some(self.check(token))
    }

    fn check(&self, token: &[u8]) -> Result<Claims, Rejection> {
        if token.len() > self.config.max_token_bytes {
            return Err(Rejection::TooLarge);
        }
        let token = std::str::from_utf8(token).map_err(|_| Rejection::Malformed)?;
        let header = decode_header(token).map_err(|e| match e.kind() {
            ErrorKind::InvalidAlgorithmName | ErrorKind::InvalidAlgorithm => {
                Rejection::AlgNotAllowed
            }
            _ => Rejection::Malformed,
        })?;
        if !self.config.algorithms.contains(&header.alg) {
            return Err(Rejection::AlgNotAllowed);
        }
        let keys = self.keys.load();
        let key = match &header.kid {
            Some(kid) if !keys.by_kid.is_empty() => keys
                .by_kid
                .iter()
                .find(|(k, _)| k == kid)
                .map(|(_, key)| key),
            _ => keys.single.as_ref(),
        }
        .ok_or(Rejection::UnknownKid)?;
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.config.leeway.as_secs();
        validation.validate_nbf = true;
        // A configured issuer or audience must be there, not only match when present.
        let mut required = vec!["exp"];
        if !self.config.issuer.is_empty() {
            validation.set_issuer(&self.config.issuer);
            required.push("iss");
        }
        if !self.config.audience.is_empty() {
            validation.set_audience(&self.config.audience);
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);
        decode::<Claims>(token, key, &validation)
            .map(|data| data.claims)
            .map_err(|e| match e.kind() {
                ErrorKind::InvalidSignature | ErrorKind::Crypto(_) => Rejection::BadSignature,
                ErrorKind::ExpiredSignature => Rejection::Expired,
                ErrorKind::MissingRequiredClaim(claim) => match claim.as_str() {
                    "iss" => Rejection::WrongIssuer,
                    "aud" => Rejection::WrongAudience,
                    _ => Rejection::Expired,
                },
                ErrorKind::ImmatureSignature => Rejection::NotYetValid,
                ErrorKind::InvalidIssuer => Rejection::WrongIssuer,
                ErrorKind::InvalidAudience => Rejection::WrongAudience,
                ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
                    Rejection::AlgNotAllowed
                }
                _ => Rejection::Malformed,
            })
    }
}

/// A claim's bytes in a key: a string's text, a number's or a boolean's JSON; `None` for
/// anything else.
pub(super) fn claim_value<'a>(
    claims: &'a Claims,
    name: &str,
) -> Option<std::borrow::Cow<'a, [u8]>> {
    match claims.get(name)? {
        serde_json::Value::String(text) => Some(text.as_bytes().into()),
        value @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_)) => {
            Some(value.to_string().into_bytes().into())
        }
        _ => None,
    }
}
