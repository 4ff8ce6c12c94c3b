//! A redis-server of a test's own, on a unix socket: started by the test, killed on drop.
//! Without redis-server on PATH, [`RedisServer::start`] says so and returns `None`, unless
//! `RATEMESH_REQUIRE_REDIS=1` (as in `.ci/run`), where it panics.

#![allow(dead_code, reason = "each test file uses the part it needs")]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A redis-server of this test's own, on a unix socket; killed on drop.
pub struct RedisServer {
    child: Child,
    dir: PathBuf,
}

impl RedisServer {
    pub fn socket(&self) -> PathBuf {
        self.dir.join("redis.sock")
    }

    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.socket().display())
    }

    /// Start one, or `None` (with a message) when redis-server is not installed.
    pub fn start(name: &str) -> Option<RedisServer> {
        let dir =
            std::env::temp_dir().join(format!("ratemesh-redis-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        match Self::spawn(&dir) {
            Some(child) => Some(RedisServer { child, dir }),
            None => {
                if std::env::var("RATEMESH_REQUIRE_REDIS").as_deref() == Ok("1") {
                    panic!("redis-server is required (RATEMESH_REQUIRE_REDIS=1) but not on PATH");
                }
                eprintln!(
                    "SKIPPED: redis-server is not on PATH; install redis-server to run {name}"
                );
                None
            }
        }
    }

    fn spawn(dir: &std::path::Path) -> Option<Child> {
        let socket = dir.join("redis.sock");
        let child = Command::new("redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(&socket)
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not open its socket"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(child)
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(self.socket());
    }

    pub fn restart(&mut self) {
        self.stop();
        self.child = Self::spawn(&self.dir).expect("redis-server restarts");
    }

    /// Return how many times Redis ran `EVALSHA` since it started.
    pub fn evalsha_calls(&self) -> u64 {
        let output = Command::new("redis-cli")
            .arg("-s")
            .arg(self.socket())
            .args(["INFO", "commandstats"])
            .output()
            .unwrap();
        let text = String::from_utf8(output.stdout).unwrap();
        text.lines()
            .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
            .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
    }

    pub fn cli(&self, args: &[&str]) {
        let status = Command::new("redis-cli")
            .arg("-s")
            .arg(self.socket())
            .args(args)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
