//! `[jwt]`: JSON Web Tokens whose verified claims policies may count by
//! (`by = ["jwt:sub"]`).
//!
//! ```toml
//! [jwt]
//! algorithms = ["RS256", "ES256"]   # the only ones accepted (`none` never is)
//! jwks_file = "jwks.json"           # keys by `kid`, read again when the file changes
//! # public_key_file = "issuer.pem"  # or one PEM key (RSA, EC or Ed25519)
//! # secret_file = "hmac.secret"     # or an HMAC secret (HS256/384/512)
//! issuer = ["https://id.example.com/"]
//! audience = ["orders-api"]
//! leeway = "30s"                    # for `exp` and `nbf`
//! header = "authorization"          # `Bearer <token>`; another header carries the token alone
//! max_token_bytes = 8192
//! ```
//!
//! Paths are relative to the policy file. A token is believed only when its signature
//! verifies with a configured key under an allowed algorithm, it has not expired (`exp` is
//! required), it is valid already (`nbf`), and its issuer and audience are the configured
//! ones when given.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http::HeaderName;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use toml::Spanned;

use super::source::{ConfigError, Source, parse_duration};

/// The longest `leeway`.
const MAX_LEEWAY: Duration = Duration::from_secs(300);
/// The default and the largest `max_token_bytes`.
const DEFAULT_MAX_TOKEN_BYTES: usize = 8192;
const MAX_MAX_TOKEN_BYTES: usize = 65536;
/// The largest key file read.
pub const MAX_KEY_FILE_BYTES: u64 = 1 << 20;

/// Where the verifying keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtKeySource {
    /// A JWKS file (keys by `kid`), read again when it changes.
    Jwks(PathBuf),
    /// One PEM public key (RSA, EC or Ed25519).
    PublicKey(PathBuf),
    /// An HMAC secret (the file's bytes, a trailing newline left out).
    Secret(PathBuf),
}

impl JwtKeySource {
    /// The key file.
    pub fn path(&self) -> &Path {
        match self {
            JwtKeySource::Jwks(p) | JwtKeySource::PublicKey(p) | JwtKeySource::Secret(p) => p,
        }
    }
}

/// A validated `[jwt]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtConfig {
    /// The header that carries the token.
    pub header: HeaderName,
    /// The accepted algorithms.
    pub algorithms: Vec<Algorithm>,
    /// The keys.
    pub keys: JwtKeySource,
    /// Accepted issuers (`iss`); empty: any.
    pub issuer: Vec<String>,
    /// Accepted audiences (`aud`); empty: a token that names one is refused.
    pub audience: Vec<String>,
    /// Leeway for `exp` and `nbf`.
    pub leeway: Duration,
    /// The longest token believed.
    pub max_token_bytes: usize,
}

/// Verifying keys read from a key file: by `kid`, and the one to use for a token without a
/// `kid` (a PEM key or a secret, or a JWKS of a single key).
pub struct KeySet {
    /// `(kid, key)` of a JWKS.
    pub by_kid: Vec<(String, DecodingKey)>,
    /// The key of a token without a `kid`.
    pub single: Option<DecodingKey>,
}

impl JwtConfig {
    /// Read and check the key file.
    pub fn load_keys(&self) -> Result<KeySet, String> {
        let path = self.keys.path();
        let bytes = super::source::read_capped(path, MAX_KEY_FILE_BYTES)?;
        match &self.keys {
            JwtKeySource::Secret(_) => {
                let secret = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
                let secret = secret.strip_suffix(b"\r").unwrap_or(secret);
                if secret.len() < 32 {
                    return Err(format!(
                        "{}: an HMAC secret of at least 32 bytes",
                        path.display()
                    ));
                }
                Ok(KeySet {
                    by_kid: Vec::new(),
                    single: Some(DecodingKey::from_secret(secret)),
                })
            }
            JwtKeySource::PublicKey(_) => {
                let key = DecodingKey::from_rsa_pem(&bytes)
                    .or_else(|_| DecodingKey::from_ec_pem(&bytes))
                    .or_else(|_| DecodingKey::from_ed_pem(&bytes))
                    .map_err(|_| {
                        format!(
                            "{}: not a PEM public key (RSA, EC or Ed25519)",
                            path.display()
                        )
                    })?;
                Ok(KeySet {
                    by_kid: Vec::new(),
                    single: Some(key),
                })
            }
            JwtKeySource::Jwks(_) => {
                let set: jsonwebtoken::jwk::JwkSet = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("{}: not a JWKS ({e})", path.display()))?;
                let mut by_kid = Vec::new();
                for (i, jwk) in set.keys.iter().enumerate() {
                    let key = DecodingKey::from_jwk(jwk)
                        .map_err(|e| format!("{}: key {i}: {e}", path.display()))?;
                    let kid = jwk.common.key_id.clone().unwrap_or_default();
                    by_kid.push((kid, key));
                }
                if by_kid.is_empty() {
                    return Err(format!("{}: a JWKS with no keys", path.display()));
                }
                let single = (by_kid.len() == 1).then(|| by_kid[0].1.clone());
                Ok(KeySet { by_kid, single })
            }
        }
    }
}

fn is_hmac(a: Algorithm) -> bool {
    matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)
}

/// `[jwt]` as the file spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJwt {
    algorithms: Vec<String>,
    jwks_file: Option<String>,
    public_key_file: Option<String>,
    secret_file: Option<String>,
    #[serde(default)]
    issuer: Vec<String>,
    #[serde(default)]
    audience: Vec<String>,
    leeway: Option<String>,
    header: Option<String>,
    max_token_bytes: Option<usize>,
}

pub(super) fn build_jwt(
    source: &Source<'_>,
    spanned: &Spanned<RawJwt>,
) -> Result<JwtConfig, ConfigError> {
    let raw = spanned.get_ref();
    let fail = |key: &str, reason: String| {
        source.error(
            source.line_of_key(spanned.span(), key),
            format!("jwt.{key}"),
            reason,
        )
    };
    let mut algorithms = Vec::new();
    for name in &raw.algorithms {
        let algorithm = match name.as_str() {
            "HS256" => Algorithm::HS256,
            "HS384" => Algorithm::HS384,
            "HS512" => Algorithm::HS512,
            "RS256" => Algorithm::RS256,
            "RS384" => Algorithm::RS384,
            "RS512" => Algorithm::RS512,
            "PS256" => Algorithm::PS256,
            "PS384" => Algorithm::PS384,
            "PS512" => Algorithm::PS512,
            "ES256" => Algorithm::ES256,
            "ES384" => Algorithm::ES384,
            "EdDSA" => Algorithm::EdDSA,
            other => {
                return Err(fail(
                    "algorithms",
                    format!(
                        "`{other}` is not an algorithm this node verifies (HS256/384/512, \
                         RS256/384/512, PS256/384/512, ES256/384, EdDSA; never `none`)"
                    ),
                ));
            }
        };
        if !algorithms.contains(&algorithm) {
            algorithms.push(algorithm);
        }
    }
    if algorithms.is_empty() {
        return Err(fail("algorithms", "name at least one algorithm".into()));
    }
    if algorithms.iter().any(|&a| is_hmac(a)) && algorithms.iter().any(|&a| !is_hmac(a)) {
        return Err(fail(
            "algorithms",
            "HMAC (HS…) and public-key algorithms together: a public key must never be \
             taken for an HMAC secret; name one kind"
                .into(),
        ));
    }
    let base = Path::new(source.file).parent().unwrap_or(Path::new(""));
    let given: Vec<(&str, &String)> = [
        ("jwks_file", &raw.jwks_file),
        ("public_key_file", &raw.public_key_file),
        ("secret_file", &raw.secret_file),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
    .collect();
    let keys = match given.as_slice() {
        [("jwks_file", p)] => JwtKeySource::Jwks(base.join(p)),
        [("public_key_file", p)] => JwtKeySource::PublicKey(base.join(p)),
        [("secret_file", p)] => JwtKeySource::Secret(base.join(p)),
        _ => {
            return Err(fail(
                "jwks_file",
                "give exactly one of `jwks_file`, `public_key_file` and `secret_file`".into(),
            ));
        }
    };
    if matches!(keys, JwtKeySource::Secret(_)) != algorithms.iter().all(|&a| is_hmac(a)) {
        let key = given[0].0;
        return Err(fail(
            key,
            "a `secret_file` goes with HS256/384/512, a public key with the others".into(),
        ));
    }
    let leeway = match &raw.leeway {
        None => Duration::from_secs(30),
        Some(text) => parse_duration(text).map_err(|reason| fail("leeway", reason))?,
    };
    if leeway > MAX_LEEWAY {
        return Err(fail(
            "leeway",
            format!("at most {MAX_LEEWAY:?}, got {leeway:?}"),
        ));
    }
    let header = match &raw.header {
        None => http::header::AUTHORIZATION,
        Some(name) => HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| fail("header", format!("`{name}` is not a header name")))?,
    };
    let max_token_bytes = raw.max_token_bytes.unwrap_or(DEFAULT_MAX_TOKEN_BYTES);
    if !(16..=MAX_MAX_TOKEN_BYTES).contains(&max_token_bytes) {
        return Err(fail(
            "max_token_bytes",
            format!("between 16 and {MAX_MAX_TOKEN_BYTES}, got {max_token_bytes}"),
        ));
    }
    let config = JwtConfig {
        header,
        algorithms,
        keys,
        issuer: raw.issuer.clone(),
        audience: raw.audience.clone(),
        leeway,
        max_token_bytes,
    };
    // The keys must load now: a file that will not verify anything is refused at start.
    config
        .load_keys()
        .map_err(|reason| fail(given[0].0, reason))?;
    Ok(config)
}
