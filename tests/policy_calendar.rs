//! Calendar periods (`calendar = "day" | "week" | "month" | "year"` with `time_zone`): a
//! local policy's windows are the zone's days, weeks, months or years, on a manual clock at
//! their edges (the last day of a leap February, a day of 23 hours, the year's end); the
//! file's checks; and a `redis` policy's day (with a Redis server when one can be started).

use std::sync::Arc;

use ratemesh::config::GatewayConfig;
use ratemesh::http::RateLimitLayer;
use ratemesh::{ManualClock, Nanos};

const S: Nanos = 1_000_000_000;
const MIN: Nanos = 60 * S;
const H: Nanos = 60 * MIN;

fn file(policy: &str) -> String {
    format!(
        "env = \"test\"\nkey_secret = \"s\"\ndefault_tier = \"api\"\n\n\
         [policies.quota]\nalgorithm = \"fixed-window\"\nlimit = 3\nby = []\n{policy}\n\n\
         [tiers.api]\npolicies = [\"quota\"]\n"
    )
}

/// Use up the quota at `at` (UNIX s); return how long the denial after says to wait.
async fn use_up(layer: &RateLimitLayer, clock: &ManualClock, at: u64) -> Nanos {
    clock.set_ns(at * S);
    let rules = layer.rules();
    let attributes = serde_json::Map::new();
    for i in 0..3 {
        let d = rules
            .decide_direct("quota", &attributes, 1, at * S)
            .await
            .unwrap();
        assert!(d.is_allowed(), "request {i} at {at}");
    }
    let d = rules
        .decide_direct("quota", &attributes, 1, at * S)
        .await
        .unwrap();
    assert!(!d.is_allowed(), "the fourth at {at}");
    d.retry_after_ns
}

async fn allowed_at(layer: &RateLimitLayer, clock: &ManualClock, at_ns: Nanos) -> bool {
    clock.set_ns(at_ns);
    layer
        .rules()
        .decide_direct("quota", &serde_json::Map::new(), 1, at_ns)
        .await
        .unwrap()
        .is_allowed()
}

fn layer(policy: &str, clock: &ManualClock) -> RateLimitLayer {
    let config = GatewayConfig::from_toml_str(&file(policy), "calendar.toml").unwrap();
    RateLimitLayer::with_clock(config, Arc::new(clock.clone())).unwrap()
}

#[tokio::test]
async fn a_month_in_paris_ends_at_its_last_midnight_even_in_a_leap_february() {
    let clock = ManualClock::new(0);
    let layer = layer("calendar = \"month\"\ntime_zone = \"Europe/Paris\"", &clock);
    // 2028-02-29T22:30:00Z is 23:30 in Paris, on February 29th: half an hour of the month
    // is left (it ends at 2028-02-29T23:00:00Z).
    let at = 1_835_476_200;
    let retry = use_up(&layer, &clock, at).await;
    assert!(retry.abs_diff(30 * MIN) <= S, "retry in {retry} ns");
    assert!(!allowed_at(&layer, &clock, at * S + 30 * MIN - S).await);
    assert!(
        allowed_at(&layer, &clock, at * S + 30 * MIN).await,
        "March has begun"
    );
}

#[tokio::test]
async fn a_day_of_twenty_three_hours_is_counted_as_one() {
    let clock = ManualClock::new(0);
    let layer = layer("calendar = \"day\"\ntime_zone = \"Europe/Paris\"", &clock);
    // 2027-03-28 in Paris runs from 2027-03-27T23:00:00Z to 2027-03-28T22:00:00Z (clocks go
    // forward at 02:00): at 00:30 local, 22 h 30 min of it are left.
    let at = 1_806_190_200;
    let retry = use_up(&layer, &clock, at).await;
    assert!(
        retry.abs_diff(22 * H + 30 * MIN) <= S,
        "retry in {retry} ns"
    );
    assert!(!allowed_at(&layer, &clock, (at * S) + 22 * H).await);
    assert!(allowed_at(&layer, &clock, at * S + 22 * H + 30 * MIN).await);
}

#[tokio::test]
async fn a_year_ends_at_new_year_utc() {
    let clock = ManualClock::new(0);
    let layer = layer("calendar = \"year\"", &clock);
    // 2026-12-31T23:59:59Z.
    let at = 1_798_761_599;
    let retry = use_up(&layer, &clock, at).await;
    assert!(retry.abs_diff(S) <= S / 100, "retry in {retry} ns");
    assert!(allowed_at(&layer, &clock, (at + 1) * S).await);
}

#[test]
fn the_file_says_what_is_wrong_with_a_calendar() {
    let error = |policy: &str| {
        GatewayConfig::from_toml_str(&file(policy), "calendar.toml")
            .expect_err("refused")
            .to_string()
    };
    assert!(error("calendar = \"fortnight\"").contains("day, week, month, year"));
    assert!(error("calendar = \"month\"\nwindow = \"30d\"").contains("not both"));
    assert!(error("calendar = \"month\"\ntime_zone = \"Mars/Olympus\"").contains("Mars/Olympus"));
    // The mesh counts calendar periods; its windows of a length take no time zone.
    let mesh = |policy: &str| file(&format!("{policy}\nbackend = \"mesh\""));
    let digest = |policy: &str| {
        GatewayConfig::from_toml_str(&mesh(policy), "calendar.toml")
            .unwrap()
            .mesh_digest()
    };
    let paris = digest("calendar = \"month\"\ntime_zone = \"Europe/Paris\"");
    assert_eq!(
        paris,
        digest("calendar = \"month\"\ntime_zone = \"Europe/Paris\"")
    );
    // Nodes that would number other windows disagree on the digest.
    assert_ne!(paris, digest("calendar = \"month\""));
    assert_ne!(
        paris,
        digest("calendar = \"week\"\ntime_zone = \"Europe/Paris\"")
    );
    assert!(
        GatewayConfig::from_toml_str(
            &mesh("window = \"1d\"\ntime_zone = \"Europe/Paris\""),
            "c.toml"
        )
        .expect_err("refused")
        .to_string()
        .contains("`calendar` periods take one")
    );
    let bucket = "env = \"t\"\ndefault_tier = \"api\"\n[policies.quota]\nalgorithm = \"token-bucket\"\n\
                  rate = 1\nperiod = \"1s\"\nburst = 2\ncalendar = \"day\"\n[tiers.api]\npolicies = [\"quota\"]\n";
    assert!(GatewayConfig::from_toml_str(bucket, "b.toml").is_err());
}

#[path = "support/redis_server.rs"]
mod redis_server;

/// A `redis` policy's calendar day in UTC ends at the next midnight UTC, by this machine's
/// clock.
#[tokio::test]
async fn a_redis_policys_day_ends_at_midnight() {
    let Some(server) = redis_server::RedisServer::start("calendar-day") else {
        return;
    };
    let text = format!(
        "{}\n[redis]\nurl = \"{}\"\n",
        file("calendar = \"day\"\nbackend = \"redis\""),
        server.url()
    );
    let config = GatewayConfig::from_toml_str(&text, "calendar.toml").unwrap();
    let redis = ratemesh::backend::redis_limits::RedisLimits::from_config(&config)
        .unwrap()
        .unwrap();
    let rules = ratemesh::rules::Rules::with_backends(config, None, Some(Arc::new(redis))).unwrap();
    let attributes = serde_json::Map::new();
    for i in 0..3 {
        let d = rules
            .decide_direct("quota", &attributes, 1, 0)
            .await
            .unwrap();
        assert!(d.is_allowed(), "request {i}");
    }
    let d = rules
        .decide_direct("quota", &attributes, 1, 0)
        .await
        .unwrap();
    assert!(!d.is_allowed());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let to_midnight = 86_400 * S - now % (86_400 * S);
    assert!(
        d.retry_after_ns.abs_diff(to_midnight) <= 2 * S,
        "retry in {} s, midnight in {} s",
        d.retry_after_ns / S,
        to_midnight / S
    );
}
