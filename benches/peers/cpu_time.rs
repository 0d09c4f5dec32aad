//! CPU time as Linux counts it (`clock_gettime`), for the examples that
//! report what a workload cost the client beside how long it took.

// Each example that includes this file reads one of the clocks.
#![allow(dead_code)]

use std::time::Duration;

/// The calling thread's (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread() -> Duration {
    read(3)
}

/// The whole process's, every thread's (`CLOCK_PROCESS_CPUTIME_ID`).
pub fn process() -> Duration {
    read(2)
}

fn read(clock: i32) -> Duration {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let ok = unsafe { clock_gettime(clock, &mut ts) };
    assert_eq!(ok, 0, "clock_gettime");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
