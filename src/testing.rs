//! What the unit tests of the mesh and the node share: the property tests' configuration,
//! and an allocator that records each thread's largest allocation (the unit tests' binary
//! runs on it, so a test can check that a decoder never allocates past its limit, whatever
//! the bytes claim).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::test_runner::{Config, FileFailurePersistence};

/// A property test's configuration: `PROPTEST_CASES` cases when set (a deeper run), else
/// `cases`; a failing case is saved beside the test's source (`*.proptest-regressions`).
pub(crate) fn proptest_config(cases: u32) -> Config {
    Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(cases),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    }
}

/// The system allocator, noting the largest allocation of each thread.
struct Largest;

thread_local! {
    /// The largest allocation made by this thread since the last reset.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is passed to `System` unchanged; the note is a thread-local `Cell`
// (`try_with` does nothing while the thread's locals are torn down).
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(layout.size())));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Largest = Largest;

/// Run `f` and return its result with the largest allocation it made on this thread.
pub(crate) fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|largest| largest.set(0));
    let result = f();
    (result, LARGEST.with(Cell::get))
}
