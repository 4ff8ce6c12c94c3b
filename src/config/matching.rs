//! What a route matches: methods, hosts, a path (a prefix, an exact path or a template with
//! `{name}` segments, or a glob) and headers; and how specific a match is (the most specific
//! route that matches a request is its route).

use http::{HeaderMap, HeaderName, Method};

/// The most segments a path pattern may have.
pub const MAX_PATTERN_SEGMENTS: usize = 32;

/// How a route matches a request's path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PathPattern {
    /// A prefix on segment boundaries (`/search` matches `/search` and `/search/x`, not
    /// `/searchx`); empty: every path.
    Prefix(String),
    /// A whole path, each segment literal or `{name}` (any one non-empty segment):
    /// `/users/{id}/orders`.
    Template(Vec<Segment>),
    /// A glob: `*` in a segment matches any characters but `/`, a `**` segment any number
    /// of segments (`/static/**/*.css`).
    Glob(Vec<String>),
}

/// One segment of a template.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Segment {
    /// This text exactly.
    Literal(String),
    /// Any one non-empty segment (`{name}`).
    Any,
}

impl PathPattern {
    /// Read a template (`path = "/users/{id}/orders"`).
    pub fn template(text: &str) -> Result<PathPattern, String> {
        let segments = split(text)?;
        Ok(PathPattern::Template(
            segments
                .into_iter()
                .map(|s| {
                    if s.starts_with('{') && s.ends_with('}') && s.len() > 2 {
                        Ok(Segment::Any)
                    } else if s.contains(['{', '}']) {
                        Err(format!("`{s}`: a `{{name}}` is a whole segment"))
                    } else {
                        Ok(Segment::Literal(s.to_string()))
                    }
                })
                .collect::<Result<_, _>>()?,
        ))
    }

    /// Read a glob (`path_glob = "/static/**/*.css"`).
    pub fn glob(text: &str) -> Result<PathPattern, String> {
        let segments = split(text)?;
        if segments.iter().any(|s| s.contains("**") && *s != "**") {
            return Err("`**` is a whole segment (`/a/**/b`)".into());
        }
        Ok(PathPattern::Glob(
            segments.into_iter().map(str::to_string).collect(),
        ))
    }

    /// Tell whether `path` (no query) matches.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathPattern::Prefix(prefix) => match path.strip_prefix(prefix.as_str()) {
                Some(rest) => rest.is_empty() || rest.starts_with('/') || prefix.is_empty(),
                None => false,
            },
            PathPattern::Template(segments) => {
                let mut parts = path_segments(path);
                for segment in segments {
                    match (segment, parts.next()) {
                        (Segment::Literal(text), Some(part)) if part == text => {}
                        (Segment::Any, Some(part)) if !part.is_empty() => {}
                        _ => return false,
                    }
                }
                parts.next().is_none()
            }
            PathPattern::Glob(pattern) => {
                let parts: smallvec::SmallVec<[&str; 16]> = path_segments(path).collect();
                glob_segments(pattern, &parts)
            }
        }
    }

    /// How specific the pattern is: its kind (a template over a glob over a prefix), then its
    /// literal length.
    pub(super) fn specificity(&self) -> (u8, usize) {
        match self {
            PathPattern::Template(s) => (
                3,
                s.iter()
                    .map(|s| match s {
                        Segment::Literal(t) => t.len() + 1,
                        Segment::Any => 1,
                    })
                    .sum(),
            ),
            PathPattern::Glob(s) => (2, s.iter().map(|s| s.replace('*', "").len() + 1).sum()),
            PathPattern::Prefix(p) => (1, p.len()),
        }
    }
}

/// A path's segments after its leading `/` (`/` has one empty segment).
fn path_segments(path: &str) -> std::str::Split<'_, char> {
    path.strip_prefix('/').unwrap_or(path).split('/')
}

fn split(text: &str) -> Result<Vec<&str>, String> {
    let Some(rest) = text.strip_prefix('/') else {
        return Err("must start with `/`".into());
    };
    let segments: Vec<&str> = rest.split('/').collect();
    if segments.len() > MAX_PATTERN_SEGMENTS {
        return Err(format!("at most {MAX_PATTERN_SEGMENTS} segments"));
    }
    Ok(segments)
}

/// Match path segments against glob segments (`**`: any number of segments), by the usual
/// greedy walk that goes back to the last `**` on a mismatch: linear in the path for one
/// `**`, at most their product in general.
fn glob_segments(pattern: &[String], parts: &[&str]) -> bool {
    let (mut p, mut s) = (0, 0);
    let mut back: Option<(usize, usize)> = None;
    while s < parts.len() {
        if p < pattern.len() && pattern[p] == "**" {
            back = Some((p, s));
            p += 1;
        } else if p < pattern.len() && wildcard(&pattern[p], parts[s]) {
            p += 1;
            s += 1;
        } else if let Some((bp, bs)) = back {
            p = bp + 1;
            s = bs + 1;
            back = Some((bp, bs + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|seg| seg == "**")
}

/// Match one segment against a pattern with `*` (any characters): the same greedy walk over
/// bytes.
fn wildcard(pattern: &str, text: &str) -> bool {
    let (pattern, text) = (pattern.as_bytes(), text.as_bytes());
    let (mut p, mut t) = (0, 0);
    let mut back: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            back = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((bp, bt)) = back {
            p = bp + 1;
            t = bt + 1;
            back = Some((bp, bt + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

/// A host a route matches: exactly, or every subdomain of one (`*.example.com`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// This host (lowercase).
    Exact(String),
    /// A host ending in `.` and this suffix.
    Subdomains(String),
}

impl HostPattern {
    /// Read a host pattern.
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        let lower = text.to_ascii_lowercase();
        let check = |host: &str| {
            if host.is_empty()
                || host.len() > 253
                || !host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            {
                Err(format!("`{text}` is not a host name (or `*.` and one)"))
            } else {
                Ok(())
            }
        };
        match lower.strip_prefix("*.") {
            Some(suffix) => check(suffix).map(|()| HostPattern::Subdomains(suffix.to_string())),
            None => check(&lower).map(|()| HostPattern::Exact(lower)),
        }
    }

    /// Tell whether `host` (without its port) matches, ignoring case.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(name) => host.eq_ignore_ascii_case(name),
            HostPattern::Subdomains(suffix) => {
                let (host, suffix) = (host.as_bytes(), suffix.as_bytes());
                host.len() > suffix.len() + 1
                    && host[host.len() - suffix.len() - 1] == b'.'
                    && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
            }
        }
    }
}

/// Everything a route matches a request by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteMatch {
    /// The methods (none: any).
    pub methods: Vec<Method>,
    /// The hosts (none: any).
    pub hosts: Vec<HostPattern>,
    /// The path.
    pub path: PathPattern,
    /// Headers that must be present (`None`) or have this value.
    pub headers: Vec<(HeaderName, Option<String>)>,
}

impl RouteMatch {
    /// Tell whether the route matches a request (`host` without its port; `headers` may be
    /// absent when the route needs none).
    pub fn matches(
        &self,
        method: &Method,
        path: &str,
        host: Option<&str>,
        headers: Option<&HeaderMap>,
    ) -> bool {
        (self.methods.is_empty() || self.methods.contains(method))
            && self.path.matches(path)
            && (self.hosts.is_empty()
                || host.is_some_and(|h| self.hosts.iter().any(|p| p.matches(h))))
            && self.headers.iter().all(|(name, value)| {
                let found = headers.and_then(|h| h.get(name));
                match (found, value) {
                    (Some(_), None) => true,
                    (Some(v), Some(want)) => v.as_bytes() == want.as_bytes(),
                    (None, _) => false,
                }
            })
    }

    /// Tell whether it reads the host or headers (beyond method and path).
    pub fn reads_request(&self) -> bool {
        !self.hosts.is_empty() || !self.headers.is_empty()
    }

    /// Tell whether it matches every request.
    pub fn matches_all(&self) -> bool {
        self.methods.is_empty()
            && self.hosts.is_empty()
            && self.headers.is_empty()
            && self.path == PathPattern::Prefix(String::new())
    }

    /// The order of matching: most specific first (the path, then hosts, methods and
    /// headers given).
    pub(super) fn specificity(&self) -> impl Ord {
        (
            self.path.specificity(),
            !self.hosts.is_empty(),
            !self.methods.is_empty(),
            self.headers.len(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_globs_and_prefixes_match_as_documented() {
        let t = PathPattern::template("/users/{id}/orders").unwrap();
        assert!(t.matches("/users/42/orders"));
        assert!(!t.matches("/users//orders"));
        assert!(!t.matches("/users/42/orders/7"));
        assert!(!t.matches("/users/42"));
        let g = PathPattern::glob("/static/**/*.css").unwrap();
        assert!(g.matches("/static/a.css"));
        assert!(g.matches("/static/x/y/z/site.min.css"));
        assert!(!g.matches("/static/x/y/site.js"));
        assert!(!g.matches("/other/a.css"));
        let all = PathPattern::glob("/**").unwrap();
        assert!(all.matches("/") && all.matches("/a/b/c"));
        let p = PathPattern::Prefix("/search".into());
        assert!(p.matches("/search") && p.matches("/search/x") && !p.matches("/searchx"));
        assert!(PathPattern::template("/a/{id}x").is_err());
        assert!(PathPattern::glob("/a/b**").is_err());
        assert!(PathPattern::glob("no-slash").is_err());
        let long = "/a".repeat(40);
        assert!(PathPattern::template(&long).is_err());
        // A long hostile path against several `**` stays quick (greedy, no blow-up).
        let hostile = PathPattern::glob("/**/a/**/b/**/c/**/d").unwrap();
        let path = "/a".repeat(4000);
        assert!(!hostile.matches(&path));
    }

    #[test]
    fn hosts_match_exactly_or_by_subdomain() {
        let exact = HostPattern::parse("API.example.com").unwrap();
        assert!(exact.matches("api.EXAMPLE.com"));
        assert!(!exact.matches("x.api.example.com"));
        let sub = HostPattern::parse("*.example.com").unwrap();
        assert!(sub.matches("a.example.com") && sub.matches("a.b.example.com"));
        assert!(!sub.matches("example.com") && !sub.matches("badexample.com"));
        assert!(HostPattern::parse("a b").is_err());
        // Any text a caller passes is safe to compare (no slicing inside a character).
        assert!(!sub.matches("ééééééééééééé"));
    }
}
