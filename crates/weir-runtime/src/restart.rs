//! Restart strategies (Flink's `restart-strategy.*`): after a failure, whether the job
//! restarts and after what delay. Pure decision logic over an explicit clock, so each
//! strategy's delays are tested without waiting.

use std::collections::VecDeque;
use std::time::Duration;

/// A configured strategy.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum RestartStrategyConfig {
    /// Never restart: the first failure fails the job.
    #[default]
    None,
    /// Restart up to `attempts` times, waiting `delay` before each.
    FixedDelay {
        /// Restarts allowed in total.
        attempts: u32,
        /// Wait before each restart.
        delay: Duration,
    },
    /// Restart unless more than `max_failures` failures fall within `interval`.
    FailureRate {
        /// Failures tolerated per interval.
        max_failures: u32,
        /// The sliding window.
        interval: Duration,
        /// Wait before each restart.
        delay: Duration,
    },
    /// Restart with a delay growing by `multiplier` up to `max_backoff`.
    ExponentialDelay {
        /// First delay.
        initial_backoff: Duration,
        /// Largest delay.
        max_backoff: Duration,
        /// Growth per consecutive failure.
        multiplier: f64,
        /// Failure-free time after which the delay and attempt count reset.
        reset_threshold: Duration,
        /// Relative random deviation of each delay (0.0 to 1.0).
        jitter: f64,
        /// Consecutive attempts allowed before the job fails (`None`: unlimited).
        attempts_before_reset: Option<u32>,
    },
}

impl RestartStrategyConfig {
    /// One line for people (the Web UI's job configuration): the strategy and its settings.
    pub fn describe(&self) -> String {
        match self {
            RestartStrategyConfig::None => "none: the first failure fails the job".to_string(),
            RestartStrategyConfig::FixedDelay { attempts, delay } => {
                format!("fixed-delay: up to {attempts} restarts, {delay:?} apart")
            }
            RestartStrategyConfig::FailureRate { max_failures, interval, delay } => {
                format!("failure-rate: at most {max_failures} failures per {interval:?}, {delay:?} before each restart")
            }
            RestartStrategyConfig::ExponentialDelay {
                initial_backoff,
                max_backoff,
                multiplier,
                reset_threshold,
                jitter,
                attempts_before_reset,
            } => {
                let attempts = match attempts_before_reset {
                    Some(n) => format!("up to {n} attempts"),
                    None => "unlimited attempts".to_string(),
                };
                format!(
                    "exponential-delay: {initial_backoff:?} growing x{multiplier} up to {max_backoff:?}, jitter {jitter}, reset after {reset_threshold:?} without failures, {attempts}"
                )
            }
        }
    }

    /// The name users configure (`restart-strategy.type`).
    pub fn name(&self) -> &'static str {
        match self {
            RestartStrategyConfig::None => "none",
            RestartStrategyConfig::FixedDelay { .. } => "fixed-delay",
            RestartStrategyConfig::FailureRate { .. } => "failure-rate",
            RestartStrategyConfig::ExponentialDelay { .. } => "exponential-delay",
        }
    }
}

/// The decision after a failure.
#[derive(Clone, Debug, PartialEq)]
pub enum RestartDecision {
    /// Restart after this delay.
    RestartAfter(Duration),
    /// Give up: the job fails, for this reason.
    GiveUp(String),
}

/// A strategy's state across failures of one job. Times are milliseconds on any monotonic
/// clock the caller chooses (the job master uses time since the job started).
#[derive(Clone, Debug)]
pub struct RestartStrategy {
    config: RestartStrategyConfig,
    restarts: u32,
    failures: VecDeque<u64>,
    attempts_since_reset: u32,
    last_failure_ms: Option<u64>,
    random_state: u64,
}

impl RestartStrategy {
    /// A fresh strategy; `seed` drives the exponential strategy's jitter.
    pub fn new(config: RestartStrategyConfig, seed: u64) -> RestartStrategy {
        RestartStrategy {
            config,
            restarts: 0,
            failures: VecDeque::new(),
            attempts_since_reset: 0,
            last_failure_ms: None,
            random_state: seed | 1,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RestartStrategyConfig {
        &self.config
    }

    /// Restarts granted so far.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// A uniform number in [-1, 1] (xorshift; only for jitter).
    fn next_unit(&mut self) -> f64 {
        let mut x = self.random_state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.random_state = x;
        (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }

    /// Decides what follows a failure at `now_ms`.
    pub fn on_failure(&mut self, now_ms: u64) -> RestartDecision {
        let decision = match self.config.clone() {
            RestartStrategyConfig::None => {
                RestartDecision::GiveUp("restart-strategy.type is none (the default without checkpointing)".into())
            }
            RestartStrategyConfig::FixedDelay { attempts, delay } => {
                if self.restarts >= attempts {
                    RestartDecision::GiveUp(format!(
                        "the fixed-delay restart strategy allows {attempts} restart(s) (restart-strategy.fixed-delay.attempts) and all were used"
                    ))
                } else {
                    RestartDecision::RestartAfter(delay)
                }
            }
            RestartStrategyConfig::FailureRate { max_failures, interval, delay } => {
                let window = interval.as_millis() as u64;
                self.failures.push_back(now_ms);
                while let Some(oldest) = self.failures.front() {
                    if now_ms.saturating_sub(*oldest) > window {
                        self.failures.pop_front();
                    } else {
                        break;
                    }
                }
                if self.failures.len() as u32 > max_failures {
                    RestartDecision::GiveUp(format!(
                        "{} failures within {} ms exceed restart-strategy.failure-rate.max-failures-per-interval ({max_failures})",
                        self.failures.len(),
                        window
                    ))
                } else {
                    RestartDecision::RestartAfter(delay)
                }
            }
            RestartStrategyConfig::ExponentialDelay {
                initial_backoff,
                max_backoff,
                multiplier,
                reset_threshold,
                jitter,
                attempts_before_reset,
            } => {
                if let Some(last) = self.last_failure_ms
                    && now_ms.saturating_sub(last) >= reset_threshold.as_millis() as u64
                {
                    self.attempts_since_reset = 0;
                }
                self.last_failure_ms = Some(now_ms);
                if let Some(limit) = attempts_before_reset
                    && self.attempts_since_reset >= limit
                {
                    RestartDecision::GiveUp(format!(
                        "the exponential-delay restart strategy used its {limit} attempt(s) (restart-strategy.exponential-delay.attempts-before-reset-backoff)"
                    ))
                } else {
                    let exponent = self.attempts_since_reset.min(64) as i32;
                    let base = initial_backoff.as_secs_f64() * multiplier.powi(exponent);
                    let jittered = base * (1.0 + jitter * self.next_unit());
                    let seconds = jittered.max(initial_backoff.as_secs_f64()).min(max_backoff.as_secs_f64());
                    self.attempts_since_reset += 1;
                    RestartDecision::RestartAfter(Duration::from_secs_f64(seconds))
                }
            }
        };
        if matches!(decision, RestartDecision::RestartAfter(_)) {
            self.restarts += 1;
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(value: u64) -> Duration {
        Duration::from_millis(value)
    }

    #[test]
    fn none_gives_up_at_once() {
        let mut strategy = RestartStrategy::new(RestartStrategyConfig::None, 1);
        assert!(matches!(strategy.on_failure(0), RestartDecision::GiveUp(_)));
        assert_eq!(strategy.restarts(), 0);
    }

    #[test]
    fn fixed_delay_restarts_attempts_times_then_gives_up() {
        let mut strategy = RestartStrategy::new(RestartStrategyConfig::FixedDelay { attempts: 2, delay: ms(500) }, 1);
        assert_eq!(strategy.on_failure(0), RestartDecision::RestartAfter(ms(500)));
        assert_eq!(strategy.on_failure(10_000), RestartDecision::RestartAfter(ms(500)));
        let RestartDecision::GiveUp(reason) = strategy.on_failure(20_000) else { panic!("third failure") };
        assert!(reason.contains("restart-strategy.fixed-delay.attempts"), "{reason}");
        assert_eq!(strategy.restarts(), 2);
    }

    #[test]
    fn failure_rate_counts_failures_in_a_sliding_window() {
        let config = RestartStrategyConfig::FailureRate { max_failures: 2, interval: ms(60_000), delay: ms(1000) };
        let mut strategy = RestartStrategy::new(config, 1);
        assert_eq!(strategy.on_failure(0), RestartDecision::RestartAfter(ms(1000)));
        assert_eq!(strategy.on_failure(30_000), RestartDecision::RestartAfter(ms(1000)));
        // The first failure left the window: still two within a minute.
        assert_eq!(strategy.on_failure(61_000), RestartDecision::RestartAfter(ms(1000)));
        let RestartDecision::GiveUp(reason) = strategy.on_failure(62_000) else { panic!("three in a minute") };
        assert!(reason.contains("max-failures-per-interval"), "{reason}");
    }

    fn exponential(jitter: f64, attempts: Option<u32>) -> RestartStrategyConfig {
        RestartStrategyConfig::ExponentialDelay {
            initial_backoff: ms(1000),
            max_backoff: ms(5000),
            multiplier: 2.0,
            reset_threshold: ms(60_000),
            jitter,
            attempts_before_reset: attempts,
        }
    }

    #[test]
    fn exponential_delay_grows_caps_and_resets_after_a_quiet_period() {
        let mut strategy = RestartStrategy::new(exponential(0.0, None), 1);
        let delays: Vec<RestartDecision> = (0..5).map(|i| strategy.on_failure(i * 100)).collect();
        assert_eq!(
            delays,
            vec![
                RestartDecision::RestartAfter(ms(1000)),
                RestartDecision::RestartAfter(ms(2000)),
                RestartDecision::RestartAfter(ms(4000)),
                RestartDecision::RestartAfter(ms(5000)),
                RestartDecision::RestartAfter(ms(5000)),
            ]
        );
        // Quiet for the reset threshold (a minute here): back to the initial backoff.
        assert_eq!(strategy.on_failure(400 + 60_000), RestartDecision::RestartAfter(ms(1000)));
    }

    #[test]
    fn exponential_jitter_stays_within_the_factor_and_attempts_are_limited() {
        let mut strategy = RestartStrategy::new(exponential(0.1, Some(3)), 42);
        let mut seen = Vec::new();
        for i in 0..3 {
            let RestartDecision::RestartAfter(delay) = strategy.on_failure(i) else { panic!("attempt {i}") };
            seen.push(delay.as_millis() as u64);
        }
        assert!((1000..=1100).contains(&seen[0]), "{seen:?}");
        assert!((1800..=2200).contains(&seen[1]), "{seen:?}");
        assert!((3600..=4400).contains(&seen[2]), "{seen:?}");
        let RestartDecision::GiveUp(reason) = strategy.on_failure(3) else { panic!("fourth attempt") };
        assert!(reason.contains("attempts-before-reset-backoff"), "{reason}");
    }
}
