//! In-process timing of `validate_bundle`, for bench/validate.sh (scenario 4): one untimed
//! warm-up call, then `reps` timed calls; prints the median in milliseconds.
//!
//!   cargo run --release -p smithers-bundle --example validate_timing -- <bundle-dir> [reps]

use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .expect("usage: validate_timing <bundle-dir> [reps]");
    let reps: usize = args
        .next()
        .map(|s| s.parse().expect("reps"))
        .unwrap_or(1)
        .max(1);
    smithers_bundle::validate_bundle(&dir).expect("the bundle must be valid");
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let start = Instant::now();
            smithers_bundle::validate_bundle(&dir).expect("the bundle must be valid");
            start.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(|a, b| a.total_cmp(b));
    let median = if reps % 2 == 1 {
        times[reps / 2]
    } else {
        (times[reps / 2 - 1] + times[reps / 2]) / 2.0
    };
    println!("{median:.3}");
}
