//! Window lengths that no test sees end: fixed and sliding windows are aligned to the UNIX
//! epoch, so a test that uses an hour-long window at 10:59:58 sees it end two seconds in,
//! whatever its length says.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The lengths chosen so far, by nominal length: one test process asks the same each time.
static CHOSEN: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// The first length of at least `nominal`, in whole seconds, whose window holding the time of
/// the first call (for this `nominal`) had at least half its length left: a test shorter
/// than that stays inside one window. The same for every call in one process.
pub fn window_with_room(nominal: Duration) -> Duration {
    let nominal = nominal.as_secs().max(2);
    let mut chosen = CHOSEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, length)) = chosen.iter().find(|(n, _)| *n == nominal) {
        return Duration::from_secs(length);
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is past 1970")
        .as_secs();
    let length = (nominal..)
        .find(|w| now % w < w / 2)
        .expect("some length has room");
    // A length chosen stays itself when asked for again.
    chosen.extend([(nominal, length), (length, length)]);
    Duration::from_secs(length)
}
