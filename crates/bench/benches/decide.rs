//! `decide()` per call, on the observations of `sandbox_bench::decide_cases`.

use criterion::{Criterion, criterion_group, criterion_main};
use sandbox_bench::decide_cases::cases;
use sandbox_core::decide;
use std::hint::black_box;
use std::time::Duration;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("decide");
    for (name, observed) in cases() {
        g.bench_function(name, |b| b.iter(|| black_box(decide(black_box(&observed)))));
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench
}
criterion_main!(benches);
