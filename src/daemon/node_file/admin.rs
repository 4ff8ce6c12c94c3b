//! The node file's `[admin]` table: a port of its own for calls an operator or an application
//! makes to the node (the decision API), each authenticated by a bearer token, a client
//! certificate, or either.
//!
//! ```toml
//! [admin]
//! listen = "127.0.0.1:8090"
//! token_file = "admin-tokens"        # lines `NAME TOKEN`; a token of at least 32 bytes
//! client_ca = "certs/ca.pem"         # mutual TLS: callers with a certificate of this CA
//! grpc_listen = "127.0.0.1:8091"     # optional: the decision API over gRPC, same callers
//! show_identities = true             # `/v1/top` shows keys in clear (never API keys)
//! show_parts = ["header:x-account"]  # and these request parts (else `(secret)`)
//! ```
//!
//! With `client_ca` both ports speak TLS with the node's `[tls]` certificate, and a caller
//! whose certificate chains to `client_ca` (the cluster CA, or an operator CA of its own) is
//! named by the certificate's common name. Without `token_file` a certificate is required
//! at the handshake; with both, a call without a certificate needs a token.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use crate::config::{ConfigError, KeyPart, Source};
use crate::rules::identities::ShowIdentities;

/// The shortest token the token file may hold.
pub(crate) const MIN_TOKEN_BYTES: usize = 32;

/// The most tokens the token file may hold.
const MAX_TOKENS: usize = 1024;

/// The `[admin]` table.
#[derive(Clone, PartialEq, Eq)]
pub struct Admin {
    /// The address of the admin port.
    pub listen: SocketAddr,
    /// The token file, as resolved against the node file's folder, if callers may give
    /// bearer tokens.
    pub token_file: Option<PathBuf>,
    /// The CA whose certificates name callers (mutual TLS), as resolved against the node
    /// file's folder; with it, the ports speak TLS.
    pub client_ca: Option<PathBuf>,
    /// The node's certificate and key (`[tls]`), which the ports present under TLS.
    pub(crate) server_cert: (PathBuf, PathBuf),
    /// Callers by name, each with its token.
    pub(crate) tokens: Vec<(String, String)>,
    /// The address of the decision API's gRPC port, if any.
    pub(crate) grpc_listen: Option<SocketAddr>,
    /// What `/v1/top` shows of keys in clear (`show_identities`, `show_parts`), if anything.
    pub(crate) show: Option<ShowIdentities>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("listen", &self.listen)
            .field("token_file", &self.token_file)
            .field("client_ca", &self.client_ca)
            .field("grpc_listen", &self.grpc_listen)
            .field(
                "callers",
                &self.tokens.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    listen: String,
    token_file: Option<String>,
    client_ca: Option<String>,
    grpc_listen: Option<String>,
    #[serde(default)]
    show_identities: bool,
    show_parts: Option<Vec<String>>,
}

/// Validate `[admin]` and read its token file; `http` is the node's HTTP address, `dir` the
/// node file's folder, `server_cert` the node's `[tls]` certificate and key.
pub(super) fn admin(
    source: &Source<'_>,
    spanned: &Spanned<RawAdmin>,
    http: SocketAddr,
    dir: &Path,
    [cert, key]: [&PathBuf; 2],
) -> Result<Admin, ConfigError> {
    let raw = spanned.get_ref();
    let span = spanned.span();
    let at = |key: &str| source.line_of_key(span.clone(), key);
    let listen = super::envoy_rls::own_port(&raw.listen, http, "127.0.0.1:8090")
        .map_err(|reason| source.error(at("listen"), "admin.listen", reason))?;
    let grpc_listen = raw
        .grpc_listen
        .as_deref()
        .map(|text| grpc_port(text, http, listen))
        .transpose()
        .map_err(|reason| source.error(at("grpc_listen"), "admin.grpc_listen", reason))?;
    let show = show(raw)
        .map_err(|(field, reason)| source.error(at(field), format!("admin.{field}"), reason))?;
    let client_ca = raw.client_ca.as_deref().map(|file| dir.join(file));
    if let Some(ca) = &client_ca {
        crate::net::tls::read_roots(ca)
            .map_err(|reason| source.error(at("client_ca"), "admin.client_ca", reason))?;
    }
    let token_file = raw.token_file.as_deref().map(|file| dir.join(file));
    let tokens = match &token_file {
        Some(token_file) => {
            let fail = |reason: String| source.error(at("token_file"), "admin.token_file", reason);
            let text = std::fs::read_to_string(token_file)
                .map_err(|e| fail(format!("{}: {e}", token_file.display())))?;
            read_tokens(&text).map_err(|(line, reason)| {
                fail(format!("{} line {line}: {reason}", token_file.display()))
            })?
        }
        None if client_ca.is_none() => {
            return Err(source.error(
                source.line_of(span.start),
                "admin",
                "give `token_file` (bearer tokens), `client_ca` (client certificates) or both: \
                 the admin port would refuse every call"
                    .to_string(),
            ));
        }
        None => Vec::new(),
    };
    Ok(Admin {
        listen,
        token_file,
        client_ca,
        server_cert: (cert.clone(), key.clone()),
        tokens,
        grpc_listen,
        show,
    })
}

/// Read `show_identities` and `show_parts`: a part that is not a header, cookie, query
/// parameter or body field, or parts without `show_identities`, is refused.
fn show(raw: &RawAdmin) -> Result<Option<ShowIdentities>, (&'static str, String)> {
    let names = raw.show_parts.as_deref().unwrap_or_default();
    if !raw.show_identities {
        if !names.is_empty() {
            return Err(("show_parts", "set `show_identities = true` too".into()));
        }
        return Ok(None);
    }
    let mut parts = Vec::new();
    for name in names {
        let part = KeyPart::parse(name).map_err(|e| ("show_parts", format!("`{name}`: {e}")))?;
        if !matches!(
            part,
            KeyPart::Header(_)
                | KeyPart::Cookie(_)
                | KeyPart::Query(_)
                | KeyPart::Json(_)
                | KeyPart::Form(_)
        ) {
            return Err((
                "show_parts",
                format!(
                    "`{name}`: name headers, cookies, query parameters or body fields \
                     (the address, user, device, JWT claims, route, method and host are shown \
                     with show_identities; API keys never are)"
                ),
            ));
        }
        parts.push(part);
    }
    Ok(Some(ShowIdentities { parts }))
}

/// Read `grpc_listen`: an address beside the node's HTTP port (`http`) and the admin port
/// (`admin`), taking neither.
fn grpc_port(text: &str, http: SocketAddr, admin: SocketAddr) -> Result<SocketAddr, String> {
    let addr = super::envoy_rls::own_port(text, http, "127.0.0.1:8091")?;
    if addr == admin
        || (addr.port() == admin.port()
            && addr.port() != 0
            && super::envoy_rls::overlaps(addr, admin))
    {
        return Err(format!(
            "{addr} is the admin port's address (`listen`); give the gRPC port its own"
        ));
    }
    Ok(addr)
}

impl Admin {
    /// Read the token file again: its callers, or why it does not load (the line, never a
    /// token).
    pub(crate) fn read_token_file(&self) -> Result<Vec<(String, String)>, String> {
        let Some(token_file) = &self.token_file else {
            return Ok(Vec::new());
        };
        let text = std::fs::read_to_string(token_file)
            .map_err(|e| format!("{}: {e}", token_file.display()))?;
        read_tokens(&text)
            .map_err(|(line, reason)| format!("{} line {line}: {reason}", token_file.display()))
    }
}

/// Read `NAME TOKEN` lines (`#` comments and blank lines skipped); an error gives the line
/// and never the token.
fn read_tokens(text: &str) -> Result<Vec<(String, String)>, (usize, String)> {
    let mut tokens: Vec<(String, String)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(name), Some(token), None) = (words.next(), words.next(), words.next()) else {
            return Err((i + 1, "write `NAME TOKEN`".into()));
        };
        if token.len() < MIN_TOKEN_BYTES {
            return Err((
                i + 1,
                format!("the token of `{name}` is shorter than {MIN_TOKEN_BYTES} bytes"),
            ));
        }
        if tokens.iter().any(|(n, t)| n == name || t == token) {
            return Err((i + 1, format!("`{name}` or its token is listed twice")));
        }
        tokens.push((name.to_string(), token.to_string()));
    }
    if tokens.is_empty() {
        return Err((
            0,
            "no tokens: the admin port would refuse every call".into(),
        ));
    }
    if tokens.len() > MAX_TOKENS {
        return Err((0, format!("at most {MAX_TOKENS} tokens")));
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_read_by_name_and_bad_lines_are_refused_without_the_token() {
        let good = "# callers\nbilling 0123456789abcdef0123456789abcdef\n\nops  fedcba9876543210fedcba9876543210\n";
        let tokens = read_tokens(good).unwrap();
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens[1].0, "ops");
        for (bad, line) in [
            ("billing short\n", 1),
            ("billing\n", 1),
            ("a 0123456789abcdef0123456789abcdef x\n", 1),
            (
                "a 0123456789abcdef0123456789abcdef\nb 0123456789abcdef0123456789abcdef\n",
                2,
            ),
            ("# nothing\n", 0),
        ] {
            let (at, reason) = read_tokens(bad).unwrap_err();
            assert_eq!(at, line, "{bad}: {reason}");
            assert!(!reason.contains("0123456789abcdef"), "{reason}");
        }
    }
}
