//! Benchmark harness for mop: synthetic workspaces ([`synth`]) and small statistics
//! helpers. Benchmarks run in release builds and report medians and p99s; they are never
//! timed tests, because shared machines are noisy.

pub mod synth;

use std::time::Duration;

/// Median and p99 of a set of samples.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// The median.
    pub median: Duration,
    /// The 99th percentile (nearest rank).
    pub p99: Duration,
    /// Number of samples.
    pub n: usize,
}

/// Summarises samples; panics on an empty set.
pub fn summarize(samples: &mut [Duration]) -> Summary {
    assert!(!samples.is_empty(), "no samples");
    samples.sort_unstable();
    let rank =
        |q: f64| samples[((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1];
    Summary {
        median: rank(0.5),
        p99: rank(0.99),
        n: samples.len(),
    }
}

/// A duration in a unit that reads well: µs below 10 ms, ms below 10 s, s above.
pub fn show(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 10_000.0 {
        format!("{us:.0} µs")
    } else if us < 10_000_000.0 {
        format!("{:.1} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}
