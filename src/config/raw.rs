//! The policy file as TOML spells it, before validation: the top-level `serde` shape (each
//! part's own shape lives with the part), refusing unknown fields, with spans where an error
//! must point at a table.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

use super::access::RawAccess;
use super::envoy::RawEnvoy;
use super::identity::RawIdentity;
use super::jwt::RawJwt;
use super::named_policy::RawPolicy;
use super::redis::RawRedis;
use super::routes::RawRoute;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) env: Option<String>,
    #[serde(default)]
    pub(super) key_secret: Option<String>,
    #[serde(default)]
    pub(super) default_tier: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) no_tier: Option<Spanned<NoTier>>,
    #[serde(default)]
    pub(super) allow_unlimited: bool,
    #[serde(default)]
    pub(super) identity: Option<Spanned<RawIdentity>>,
    #[serde(default)]
    pub(super) access: Option<Spanned<RawAccess>>,
    #[serde(default)]
    pub(super) jwt: Option<Spanned<RawJwt>>,
    #[serde(default)]
    pub(super) headers: Option<RawHeaders>,
    #[serde(default)]
    pub(super) policies: BTreeMap<String, Spanned<RawPolicy>>,
    #[serde(default)]
    pub(super) tiers: BTreeMap<String, Spanned<RawTier>>,
    #[serde(default)]
    pub(super) tenants: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    pub(super) plans_file: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) tier_from: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub(super) routes: Vec<Spanned<RawRoute>>,
    #[serde(default)]
    pub(super) redis: Option<Spanned<RawRedis>>,
    #[serde(default)]
    pub(super) envoy: Option<Spanned<RawEnvoy>>,
}

/// What happens to a client that matches no tier when there is no `default_tier`.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum NoTier {
    /// Refuse its requests (a limit of zero).
    Refuse,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHeaders {
    #[serde(default)]
    pub(super) legacy: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTier {
    pub(super) policies: Vec<String>,
}
