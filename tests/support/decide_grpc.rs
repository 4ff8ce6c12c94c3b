//! A client of the decision API over gRPC (`ratemesh.decide.v1.Decide`), its messages written
//! from `docs/decide.proto` apart from the node's own (what a client generated from the file
//! would send), on tonic's generic client. Included with `#[path]` by the test and the
//! benchmark.

#![allow(dead_code, reason = "the test and the benchmark use different parts")]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

#[derive(Clone, PartialEq, prost::Message)]
pub struct DecideRequest {
    #[prost(message, repeated, tag = "1")]
    pub checks: Vec<Check>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Check {
    #[prost(string, tag = "1")]
    pub policy: String,
    #[prost(map = "string, string", tag = "2")]
    pub attributes: HashMap<String, String>,
    #[prost(uint64, optional, tag = "3")]
    pub cost: Option<u64>,
    #[prost(string, tag = "4")]
    pub jwt_claims_json: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DecideResponse {
    #[prost(message, repeated, tag = "1")]
    pub results: Vec<DecideResult>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DecideResult {
    #[prost(bool, tag = "1")]
    pub allowed: bool,
    #[prost(uint64, tag = "2")]
    pub limit: u64,
    #[prost(uint64, tag = "3")]
    pub remaining: u64,
    #[prost(uint64, tag = "4")]
    pub reset_after_ms: u64,
    #[prost(uint64, tag = "5")]
    pub retry_after_ms: u64,
    #[prost(string, tag = "6")]
    pub error: String,
    #[prost(string, tag = "7")]
    pub message: String,
}

impl DecideResult {
    /// `allowed`, `denied` or the error's kind.
    pub fn kind(&self) -> &str {
        match (self.error.as_str(), self.allowed) {
            ("", true) => "allowed",
            ("", false) => "denied",
            (error, _) => error,
        }
    }
}

/// A check of `policy` with `attributes` (cost not set: 1).
pub fn check(policy: &str, attributes: &[(&str, &str)]) -> Check {
    Check {
        policy: policy.to_string(),
        attributes: attributes
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        cost: None,
        jwt_claims_json: String::new(),
    }
}

/// A channel to a node's gRPC port, with a bearer token.
#[derive(Clone)]
pub struct DecideClient {
    grpc: tonic::client::Grpc<Channel>,
    token: String,
}

impl DecideClient {
    /// Connect to `addr` (retried for up to 10 s while the node starts); every call has a
    /// 10 s deadline.
    pub async fn connect(addr: SocketAddr, token: &str) -> DecideClient {
        let endpoint = Endpoint::new(format!("http://{addr}"))
            .unwrap()
            .timeout(Duration::from_secs(10))
            .tcp_nodelay(true);
        let deadline = Instant::now() + Duration::from_secs(10);
        let channel = loop {
            match endpoint.connect().await {
                Ok(channel) => break channel,
                Err(error) => {
                    assert!(Instant::now() < deadline, "cannot reach {addr}: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        DecideClient {
            grpc: tonic::client::Grpc::new(channel),
            token: token.to_string(),
        }
    }

    /// Connect to `addr` over TLS (an admin port with `client_ca`), checking the node's
    /// certificate against `ca_pem` and presenting `identity` (certificate and key, PEM).
    pub async fn connect_tls(
        addr: SocketAddr,
        ca_pem: &[u8],
        identity: Option<(&[u8], &[u8])>,
    ) -> Result<DecideClient, tonic::transport::Error> {
        let (mut config, name) = ratemesh::net::admin_client(ca_pem, identity).unwrap();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        let endpoint = Endpoint::new(format!("http://{addr}"))
            .unwrap()
            .timeout(Duration::from_secs(10));
        let channel = endpoint
            .connect_with_connector(tower::service_fn(move |_| {
                let (connector, name) = (connector.clone(), name.clone());
                async move {
                    let tcp = tokio::net::TcpStream::connect(addr).await?;
                    let tls = connector.connect(name, tcp).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
                }
            }))
            .await?;
        Ok(DecideClient {
            grpc: tonic::client::Grpc::new(channel),
            token: String::new(),
        })
    }

    /// The same channel with another token (empty: none).
    pub fn with_token(&self, token: &str) -> DecideClient {
        DecideClient {
            grpc: self.grpc.clone(),
            token: token.to_string(),
        }
    }

    /// Call `Decide` with `checks`.
    pub async fn decide(&mut self, checks: Vec<Check>) -> Result<Vec<DecideResult>, tonic::Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| tonic::Status::unknown(format!("not ready: {e}")))?;
        let mut request = tonic::Request::new(DecideRequest { checks });
        if !self.token.is_empty() {
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {}", self.token).parse().unwrap(),
            );
        }
        let path = http::uri::PathAndQuery::from_static("/ratemesh.decide.v1.Decide/Decide");
        let codec = tonic_prost::ProstCodec::<DecideRequest, DecideResponse>::default();
        let response = self.grpc.unary(request, path, codec).await?;
        Ok(response.into_inner().results)
    }
}
