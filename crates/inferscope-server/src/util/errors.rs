//! Errors as the gateway reasons about them: walking an error's chain of sources (the cause a
//! decision depends on is often a few layers down, wrapped by hyper), and logging a recurring
//! failure at most every so often with a count instead of once per occurrence.

use std::error::Error;
use std::time::{Duration, Instant};

/// `e` and each of its sources in turn — including the error an `io::Error` wraps (its own
/// `source` skips it).
pub fn chain<'a>(e: &'a (dyn Error + 'static)) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(e), |&e| {
        match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn Error + 'static)),
            None => e.source(),
        }
    })
}

/// The first error of type `T` in `e`'s chain.
pub fn find<'a, T: Error + 'static>(e: &'a (dyn Error + 'static)) -> Option<&'a T> {
    chain(e).find_map(|e| e.downcast_ref::<T>())
}

/// Counts occurrences of a recurring failure and says when one should be logged: the first, then
/// at most one per `every`, each with how many happened since the last logged one.
#[derive(Debug)]
pub struct Sparse {
    every: Duration,
    since: u64,
    at: Option<Instant>,
}

impl Sparse {
    /// At most one log line per `every`.
    pub fn every(every: Duration) -> Self {
        Self {
            every,
            since: 0,
            at: None,
        }
    }

    /// One more occurrence: `Some(occurrences since the last line)` when this one is to be
    /// logged.
    pub fn hit(&mut self) -> Option<u64> {
        self.since += 1;
        let now = Instant::now();
        if self.at.is_some_and(|t| now.duration_since(t) < self.every) {
            return None;
        }
        self.at = Some(now);
        Some(std::mem::take(&mut self.since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_logs_the_first_then_counts() {
        let mut s = Sparse::every(Duration::from_secs(3600));
        assert_eq!(s.hit(), Some(1));
        assert_eq!((s.hit(), s.hit()), (None, None));
        s.at = Some(Instant::now() - Duration::from_secs(3601));
        assert_eq!(s.hit(), Some(3));
    }

    #[derive(Debug)]
    struct Outer(std::fmt::Error);

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("outer")
        }
    }

    impl Error for Outer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn find_looks_through_sources() {
        let e = Outer(std::fmt::Error);
        assert_eq!(chain(&e).count(), 2);
        assert!(find::<std::fmt::Error>(&e).is_some());
        assert!(find::<std::num::ParseIntError>(&e).is_none());
    }
}
