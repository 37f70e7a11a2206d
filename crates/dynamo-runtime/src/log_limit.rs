//! A log line per event, without flooding: [`LogLimiter`] lets a few events per second be
//! logged and counts the rest, so that the next logged one can say how many were left out.
//! Used for per-request events that are rare in normal operation but can come in bursts
//! (client disconnects, cancellations): each one is visible at the default level, and a
//! storm of them costs a handful of lines per second.

use std::sync::Mutex;
use std::time::Instant;

/// Admits at most `per_second` events in each one-second window.
#[derive(Debug)]
pub struct LogLimiter {
    per_second: u32,
    state: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    start: Option<Instant>,
    admitted: u32,
    suppressed: u64,
}

impl LogLimiter {
    /// A limiter admitting `per_second` events per second.
    pub const fn new(per_second: u32) -> Self {
        Self {
            per_second,
            state: Mutex::new(Window {
                start: None,
                admitted: 0,
                suppressed: 0,
            }),
        }
    }

    /// `Some(n)` when this event may be logged, `n` being the events left out since the
    /// last one logged; `None` when it must not (it is counted).
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut w = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if w.start
            .is_none_or(|s| now.duration_since(s).as_secs_f64() >= 1.0)
        {
            w.start = Some(now);
            w.admitted = 0;
        }
        if w.admitted < self.per_second {
            w.admitted += 1;
            Some(std::mem::take(&mut w.suppressed))
        } else {
            w.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn admits_a_few_per_second_and_counts_the_rest() {
        let l = LogLimiter::new(2);
        let t0 = Instant::now();
        assert_eq!(l.admit_at(t0), Some(0));
        assert_eq!(l.admit_at(t0 + Duration::from_millis(10)), Some(0));
        assert_eq!(l.admit_at(t0 + Duration::from_millis(20)), None);
        assert_eq!(l.admit_at(t0 + Duration::from_millis(30)), None);
        // A new window: the first logged event reports the two left out.
        assert_eq!(l.admit_at(t0 + Duration::from_millis(1000)), Some(2));
        assert_eq!(l.admit_at(t0 + Duration::from_millis(1001)), Some(0));
        assert_eq!(l.admit_at(t0 + Duration::from_millis(1002)), None);
    }
}
