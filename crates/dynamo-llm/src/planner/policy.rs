//! The scaling policy: load-based, with hysteresis. Pure (no I/O, no clock), so it is
//! tested tick by tick.
//!
//! Each tick the planner measures a **load ratio** per pool:
//!
//! * prefill (or aggregated) pool: `ttft / ttft_target`;
//! * decode (or aggregated) pool: `itl / itl_target`;
//!
//! (an aggregated pool uses the larger of the two). TTFT and ITL are the frontend's means
//! over the last interval when its `/metrics` is configured, else estimated from FPM: ITL ≈
//! the mean duration of busy forward passes; TTFT ≈ that plus the queued prefill tokens per
//! worker divided by the measured prefill throughput per worker.
//!
//! A [`Controller`] turns ratios into a worker count:
//!
//! * **up**: ratio above `up_ratio` for `up_ticks` ticks in a row → `ceil(n · ratio /
//!   target_ratio)`, at least `n + 1`, at most `n + max_step`;
//! * **down**: ratio below `down_ratio` for `down_ticks` ticks in a row → `n − 1` (one at a
//!   time: shrinking too fast costs more than staying large a few more ticks), and only if
//!   the ratio projected on `n − 1` workers (`ratio · n / (n − 1)`) stays below
//!   `target_ratio`;
//! * between the two thresholds (the dead band) both streaks reset; after any decision both
//!   reset too, so the next one needs a fresh streak measured with the new workers; a tick
//!   without data (no snapshot in the interval) is skipped;
//! * the result is clamped to `[min_workers, max_workers]`.

use serde::{Deserialize, Serialize};

/// Thresholds of the hysteresis controller (flags of `python -m dynamo.planner`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default)]
pub struct Hysteresis {
    /// Scale up above this load ratio (measured latency / target)
    #[arg(long, default_value_t = Hysteresis::default().up_ratio)]
    pub up_ratio: f64,
    /// Scale down below this load ratio
    #[arg(long, default_value_t = Hysteresis::default().down_ratio)]
    pub down_ratio: f64,
    /// Load ratio aimed at when sizing a scale-up (and the bound a scale-down must keep)
    #[arg(long, default_value_t = Hysteresis::default().target_ratio)]
    pub target_ratio: f64,
    /// Consecutive decisions above --up-ratio before scaling up
    #[arg(long, default_value_t = Hysteresis::default().up_ticks)]
    pub up_ticks: u32,
    /// Consecutive decisions below --down-ratio before scaling down
    #[arg(long, default_value_t = Hysteresis::default().down_ticks)]
    pub down_ticks: u32,
    /// Most workers added by one decision
    #[arg(long, default_value_t = Hysteresis::default().max_step)]
    pub max_step: u32,
    /// Fewest workers of a pool
    #[arg(long, default_value_t = Hysteresis::default().min_workers)]
    pub min_workers: u32,
    /// Most workers of a pool
    #[arg(long, default_value_t = Hysteresis::default().max_workers)]
    pub max_workers: u32,
}

impl Default for Hysteresis {
    fn default() -> Self {
        Self {
            // Above target by any margin is a miss of the SLO: react.
            up_ratio: 1.0,
            // Well under half the budget: the pool is clearly oversized. The wide band
            // between 0.4 and 1.0 keeps the count from oscillating around the target.
            down_ratio: 0.4,
            // Size scale-ups for 80% of the budget, leaving room for bursts.
            target_ratio: 0.8,
            up_ticks: 2,
            down_ticks: 3,
            max_step: 2,
            min_workers: 1,
            max_workers: 8,
        }
    }
}

/// One pool's controller.
#[derive(Debug, Clone, Default)]
pub struct Controller {
    above: u32,
    below: u32,
}

impl Controller {
    /// Feed one tick: `workers` in the pool now, its load `ratio` (None: no data; the
    /// tick is skipped). Returns the new count when it should change.
    pub fn tick(&mut self, h: &Hysteresis, workers: u32, ratio: Option<f64>) -> Option<u32> {
        let n = workers.max(1);
        let clamp = |x: u32| x.clamp(h.min_workers.max(1), h.max_workers.max(h.min_workers));
        // Outside the bounds (e.g. the bounds changed): correct at once.
        if clamp(workers) != workers {
            self.reset();
            return Some(clamp(workers));
        }
        // No data this tick (e.g. an interval shorter than the idle heartbeat): neither
        // evidence for nor against, so the streaks are kept.
        let r = ratio.filter(|r| r.is_finite())?;
        if r > h.up_ratio {
            self.above += 1;
            self.below = 0;
        } else if r < h.down_ratio {
            self.below += 1;
            self.above = 0;
        } else {
            self.reset();
        }
        if self.above >= h.up_ticks.max(1) {
            let wanted = (f64::from(n) * r / h.target_ratio.max(1e-6)).ceil();
            let wanted = (wanted.min(f64::from(u32::MAX)) as u32)
                .max(n + 1)
                .min(n + h.max_step.max(1));
            self.reset();
            let next = clamp(wanted);
            return (next != workers).then_some(next);
        }
        if self.below >= h.down_ticks.max(1) && n > 1 {
            let projected = r * f64::from(n) / f64::from(n - 1);
            if projected < h.target_ratio {
                self.reset();
                let next = clamp(n - 1);
                return (next != workers).then_some(next);
            }
        }
        None
    }

    fn reset(&mut self) {
        self.above = 0;
        self.below = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_up_after_a_streak_and_down_one_at_a_time() {
        let h = Hysteresis::default();
        let mut c = Controller::default();
        assert_eq!(c.tick(&h, 1, Some(2.0)), None);
        // Second tick above: 1 * 2.0 / 0.8 = 2.5 -> 3 (max_step 2).
        assert_eq!(c.tick(&h, 1, Some(2.0)), Some(3));
        // Dead band: nothing, and streaks reset.
        assert_eq!(c.tick(&h, 3, Some(0.7)), None);
        assert_eq!(c.tick(&h, 3, Some(0.1)), None);
        assert_eq!(c.tick(&h, 3, Some(0.1)), None);
        assert_eq!(c.tick(&h, 3, Some(0.1)), Some(2));
        // Projected load on one fewer worker would exceed the target: stay.
        let strict = Hysteresis {
            target_ratio: 0.5,
            ..h
        };
        for _ in 0..5 {
            assert_eq!(c.tick(&strict, 2, Some(0.3)), None);
        }
        // No data: the tick is skipped, the streak kept.
        let mut c = Controller::default();
        assert_eq!(c.tick(&h, 2, Some(0.0)), None);
        assert_eq!(c.tick(&h, 2, None), None);
        assert_eq!(c.tick(&h, 2, Some(0.0)), None);
        assert_eq!(c.tick(&h, 2, Some(0.0)), Some(1));
        assert_eq!(c.tick(&h, 1, Some(0.0)), None);
        // Bounds.
        let tight = Hysteresis {
            max_workers: 2,
            ..h
        };
        let mut c = Controller::default();
        c.tick(&tight, 1, Some(9.0));
        assert_eq!(c.tick(&tight, 1, Some(9.0)), Some(2));
        assert_eq!(c.tick(&tight, 5, None), Some(2));
    }
}
