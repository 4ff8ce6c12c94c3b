//! What the tests of `[envoy_rls]` share: a cluster with the gRPC port, a tonic client of
//! Envoy's rate limit service, requests and descriptors, and staying clear of window ends.

#![allow(dead_code, reason = "each test file uses the part it needs")]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;

use crate::support::{edit_file, write_cluster_with};

/// Write a cluster of `n` nodes with `[envoy_rls]`; return the node files and gRPC addresses.
pub fn rls_cluster(dir: &Path, n: usize, policies: &str) -> (Vec<PathBuf>, Vec<SocketAddr>) {
    let files = write_cluster_with(dir, n, policies);
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    drop(listeners);
    for (file, addr) in files.iter().zip(&addrs) {
        edit_file(file, |text| {
            format!("{text}\n[envoy_rls]\nlisten = \"{addr}\"\n")
        });
    }
    (files, addrs)
}

pub fn unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Wait, if need be, so that the next `seconds` stay inside one minute and one hour.
pub fn away_from_window_ends(seconds: f64) {
    let into_minute = unix_seconds() % 60.0;
    if into_minute + seconds > 60.0 {
        std::thread::sleep(Duration::from_secs_f64(60.5 - into_minute));
    }
}

pub async fn rls_client(addr: SocketAddr) -> RateLimitServiceClient<tonic::transport::Channel> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match RateLimitServiceClient::connect(format!("http://{addr}")).await {
            Ok(client) => return client,
            Err(error) => {
                assert!(Instant::now() < deadline, "cannot reach {addr}: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

pub fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: key.to_string(),
                value: value.to_string(),
            })
            .collect(),
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..RateLimitDescriptor::default()
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: hits,
    }
}

pub async fn ask(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    request: RateLimitRequest,
) -> Result<RateLimitResponse, tonic::Status> {
    client
        .should_rate_limit(request)
        .await
        .map(|r| r.into_inner())
}
