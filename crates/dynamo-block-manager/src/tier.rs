//! The memory tiers a pool can serve. A file of its own because both the error type
//! ([`Error::PoolNotConfigured`](crate::Error::PoolNotConfigured)) and the pools name it,
//! and the pools import the error type.

use std::fmt;

/// The tier a pool serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Tier {
    /// G1: GPU memory.
    Device,
    /// G2: host memory.
    Host,
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::Device => "Device",
            Tier::Host => "Host",
        })
    }
}
