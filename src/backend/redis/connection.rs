//! How a node reaches Redis: one server, a Redis Cluster, or the primary that Sentinels name,
//! each over TCP, a Unix socket or TLS (`rediss://`, with the CAs and client certificate of
//! `[redis.tls]`). Every kind connects on first use, so a gateway starts while Redis is down.

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use ::redis::{Client, Cmd, IntoConnectionInfo, RedisError, Script, TlsCertificates, Value};

use super::BackendError;
use crate::config::{RedisConfig, RedisEndpoints, RedisTls};

/// A multiplexed connection that reconnects by itself.
#[derive(Clone)]
pub enum RedisConnection {
    /// One Redis server (`redis://…`, `rediss://…` or `redis+unix://…`).
    Single(ConnectionManager),
    /// A Redis Cluster, connected on first use.
    Cluster(Arc<LazyCluster>),
    /// The primary the Sentinels name, asked again after a failed call.
    Sentinel(Arc<SentinelPrimary>),
}

/// A cluster client whose connection is made by the first call (and retried by later calls
/// while the cluster is unreachable).
pub struct LazyCluster {
    client: ::redis::cluster::ClusterClient,
    connection: tokio::sync::OnceCell<::redis::cluster_async::ClusterConnection>,
}

impl LazyCluster {
    async fn connection(&self) -> Result<::redis::cluster_async::ClusterConnection, RedisError> {
        self.connection
            .get_or_try_init(|| self.client.get_async_connection())
            .await
            .cloned()
    }
}

/// The primary of a Sentinel-monitored deployment: found through the Sentinels on first use,
/// kept while calls succeed, and found again after a call fails (a failover moves it; the
/// call that failed follows its policy's fail mode).
pub struct SentinelPrimary {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    primary: arc_swap::ArcSwapOption<ConnectionManager>,
    config: ConnectionManagerConfig,
    /// A call's timeout: finding the primary counts within it.
    timeout: Duration,
}

impl SentinelPrimary {
    /// The connection to the primary, asking the Sentinels for it if there is none (within
    /// the call's timeout, waiting for another call's asking included: past it the call
    /// fails and its fail mode answers).
    async fn connection(&self) -> Result<ConnectionManager, RedisError> {
        if let Some(primary) = self.primary.load_full() {
            return Ok((*primary).clone());
        }
        tokio::time::timeout(self.timeout, self.discover())
            .await
            .map_err(|_| {
                RedisError::from((
                    ::redis::ErrorKind::Io,
                    "the Sentinels named no primary within the timeout",
                ))
            })?
    }

    /// Ask the Sentinels for the primary, one call at a time.
    async fn discover(&self) -> Result<ConnectionManager, RedisError> {
        let mut sentinels = self.sentinels.lock().await;
        // Another call may have found it while this one waited.
        if let Some(primary) = self.primary.load_full() {
            return Ok((*primary).clone());
        }
        let client = sentinels.async_get_client().await?;
        let manager = ConnectionManager::new_lazy_with_config(client, self.config.clone())?;
        self.primary.store(Some(Arc::new(manager.clone())));
        Ok(manager)
    }

    /// Forget the primary after `error`, unless Redis itself answered (a script error, a
    /// missing script): the next call asks the Sentinels again.
    fn failed(&self, error: &RedisError) {
        let answered = matches!(
            error.kind(),
            ::redis::ErrorKind::Server(kind) if kind != ::redis::ServerErrorKind::ReadOnly
        );
        if !answered {
            self.primary.store(None);
        }
    }
}

/// What `[redis.tls]` holds, as the client takes it.
fn certificates(tls: &RedisTls) -> TlsCertificates {
    TlsCertificates {
        client_tls: tls
            .client_pem
            .as_ref()
            .map(|(cert, key)| ::redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca_pem.clone(),
    }
}

/// Make sure rustls has a process-wide crypto provider (the Redis client builds its TLS
/// configuration with the default one): `ring`, unless the process installed another.
fn crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Lost a race with another thread installing one: that one serves.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(Some(timeout))
        .set_connection_timeout(Some(timeout))
        .set_number_of_retries(1)
}

fn needs_runtime() -> Result<(), BackendError> {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => Ok(()),
        Err(_) => Err(BackendError::NoRuntime),
    }
}

impl RedisConnection {
    /// Connect lazily to one server: the first call connects, so a gateway starts even while
    /// Redis is down (its policies then follow their fail mode). Call it inside a tokio
    /// runtime (the connection's driver is spawned there).
    pub fn single(url: &str, timeout: Duration) -> Result<Self, BackendError> {
        Self::single_with(url, timeout, None)
    }

    fn single_with(
        url: &str,
        timeout: Duration,
        tls: Option<&RedisTls>,
    ) -> Result<Self, BackendError> {
        needs_runtime()?;
        if url.starts_with("rediss://") {
            crypto_provider();
        }
        let client = match tls {
            Some(tls) => Client::build_with_tls(url, certificates(tls))?,
            None => Client::open(url)?,
        };
        Ok(RedisConnection::Single(
            ConnectionManager::new_lazy_with_config(client, manager_config(timeout))?,
        ))
    }

    /// Prepare a Redis Cluster client over any of its nodes; it connects on first use.
    pub fn cluster(urls: &[String], timeout: Duration) -> Result<Self, BackendError> {
        Self::cluster_with(urls, timeout, None)
    }

    fn cluster_with(
        urls: &[String],
        timeout: Duration,
        tls: Option<&RedisTls>,
    ) -> Result<Self, BackendError> {
        if urls.iter().any(|u| u.starts_with("rediss://")) {
            crypto_provider();
        }
        let mut builder = ::redis::cluster::ClusterClientBuilder::new(urls.to_vec())
            .response_timeout(timeout)
            .connection_timeout(timeout);
        if let Some(tls) = tls {
            builder = builder.certs(certificates(tls));
        }
        Ok(RedisConnection::Cluster(Arc::new(LazyCluster {
            client: builder.build()?,
            connection: tokio::sync::OnceCell::new(),
        })))
    }

    /// Prepare a client of the primary that the Sentinels at `sentinels` monitor as
    /// `master`; it asks them on first use and again after a call fails. With `rediss://`
    /// Sentinels, the Sentinels and the primary are reached over TLS (`tls` for both).
    pub fn sentinel(
        sentinels: &[String],
        master: &str,
        timeout: Duration,
        tls: Option<&RedisTls>,
    ) -> Result<Self, BackendError> {
        needs_runtime()?;
        let secure = sentinels.iter().any(|u| u.starts_with("rediss://"));
        if secure {
            crypto_provider();
        }
        let addrs = sentinels
            .iter()
            .map(|url| Ok(url.as_str().into_connection_info()?.addr().clone()))
            .collect::<Result<Vec<_>, RedisError>>()?;
        let tcp = ::redis::io::tcp::TcpSettings::default();
        let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)?
            .set_client_to_redis_tcp_settings(tcp.clone())
            .set_client_to_sentinel_tcp_settings(tcp);
        if secure {
            builder = builder
                .set_client_to_redis_tls_mode(::redis::TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(::redis::TlsMode::Secure);
            if let Some(tls) = tls {
                builder = builder
                    .set_client_to_redis_certificates(certificates(tls))
                    .set_client_to_sentinel_certificates(certificates(tls));
            }
        }
        Ok(RedisConnection::Sentinel(Arc::new(SentinelPrimary {
            sentinels: tokio::sync::Mutex::new(builder.build()?),
            primary: arc_swap::ArcSwapOption::empty(),
            config: manager_config(timeout),
            timeout,
        })))
    }

    /// Connect to the deployment a policy file names.
    pub fn from_config(config: &RedisConfig) -> Result<Self, BackendError> {
        let tls = config.tls.as_ref();
        match &config.endpoints {
            RedisEndpoints::Single(url) => Self::single_with(url, config.timeout, tls),
            RedisEndpoints::Cluster(urls) => Self::cluster_with(urls, config.timeout, tls),
            RedisEndpoints::Sentinel { sentinels, master } => {
                Self::sentinel(sentinels, master, config.timeout, tls)
            }
        }
    }

    /// Run `command`.
    pub(super) async fn query(&self, command: Cmd) -> Result<Value, RedisError> {
        match self {
            RedisConnection::Single(manager) => command.query_async(&mut manager.clone()).await,
            RedisConnection::Cluster(cluster) => {
                command.query_async(&mut cluster.connection().await?).await
            }
            RedisConnection::Sentinel(primary) => {
                let result =
                    async { command.query_async(&mut primary.connection().await?).await }.await;
                if let Err(error) = &result {
                    primary.failed(error);
                }
                result
            }
        }
    }

    /// Load `script` into the server's script cache.
    pub(super) async fn load_script(&self, script: &Script) -> Result<(), RedisError> {
        match self {
            RedisConnection::Single(manager) => {
                script.load_async(&mut manager.clone()).await?;
            }
            RedisConnection::Cluster(cluster) => {
                script.load_async(&mut cluster.connection().await?).await?;
            }
            RedisConnection::Sentinel(primary) => {
                let result =
                    async { script.load_async(&mut primary.connection().await?).await }.await;
                if let Err(error) = &result {
                    primary.failed(error);
                }
                result?;
            }
        }
        Ok(())
    }
}
