//! The userspace delay line on NFQUEUE behind `tailmesh delay-line`, for
//! kernels without `sch_netem` (nftables' own `queue` statement is missing there
//! too, so an iptables `-j NFQUEUE` rule feeds it).
//!
//! It runs inside a replica's namespace, reads every packet the rule
//! queues, holds it for `delay ± jitter` (uniform, seeded) and then
//! accepts it. Each packet is delayed on its own, in each direction the
//! rules cover; with jitter, packets can be reordered, as with netem. It
//! exits on EOF on stdin (its launcher died or is done), accepting every
//! packet it still holds first; the rules use `--queue-bypass`, so without
//! a reader packets pass undelayed instead of being dropped.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    io::{self, BufRead, Write},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use rand::{Rng, SeedableRng, rngs::StdRng};

/// How long the loop sleeps when nothing is due and nothing arrived.
const IDLE: Duration = Duration::from_micros(100);
/// Most packets held at once; beyond that packets are accepted at once
/// (the kernel's own queue limit is the other guard).
const MAX_HELD: usize = 100_000;

/// Draws each packet's hold time: `delay ± jitter`, uniform.
#[derive(Debug)]
struct Hold {
    delay: Duration,
    jitter: Duration,
    rng: StdRng,
}

impl Hold {
    /// A drawer with its own seeded generator; `jitter <= delay`.
    fn new(delay: Duration, jitter: Duration, seed: u64) -> Self {
        Self {
            delay,
            jitter: jitter.min(delay),
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The next packet's hold time.
    fn draw(&mut self) -> Duration {
        if self.jitter.is_zero() {
            return self.delay;
        }
        let j = self.jitter.as_nanos() as i128;
        let offset = self.rng.random_range(-j..=j);
        let total = (self.delay.as_nanos() as i128 + offset).max(0);
        Duration::from_nanos(u64::try_from(total).unwrap_or(u64::MAX))
    }
}

/// Serves queue `queue` until stdin closes. Prints `ready` on stdout once
/// bound, so the caller adds the iptables rules only then.
pub fn run(queue: u16, delay: Duration, jitter: Duration, seed: u64) -> io::Result<()> {
    let mut q = nfq::Queue::open()?;
    q.bind(queue)?;
    // Never drop a packet because this reader is slow: accept it instead.
    q.set_fail_open(queue, true)?;
    q.set_nonblocking(true);
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut sink = String::new();
            let stdin = io::stdin();
            let mut lock = stdin.lock();
            while matches!(lock.read_line(&mut sink), Ok(n) if n > 0) {
                sink.clear();
            }
            stop.store(true, Ordering::SeqCst);
        });
    }
    {
        // Only EOF on stdin ends the line; a closed stdout does not.
        let mut stdout = io::stdout().lock();
        let _ = writeln!(stdout, "ready");
        stdout.flush()?;
    }

    let mut hold = Hold::new(delay, jitter, seed);
    let mut held: BinaryHeap<Reverse<(Instant, u64)>> = BinaryHeap::new();
    let mut messages: std::collections::HashMap<u64, nfq::Message> =
        std::collections::HashMap::new();
    let mut seq = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let mut got = false;
        // Bounded: at most 1024 packets per round, then release what is due.
        for _ in 0..1024 {
            match q.recv() {
                Ok(mut msg) => {
                    got = true;
                    msg.set_verdict(nfq::Verdict::Accept);
                    if messages.len() >= MAX_HELD {
                        q.verdict(msg)?;
                        continue;
                    }
                    seq += 1;
                    held.push(Reverse((Instant::now() + hold.draw(), seq)));
                    messages.insert(seq, msg);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.raw_os_error() == Some(105) => break, // ENOBUFS: packets were accepted by fail-open
                Err(e) => return Err(e),
            }
        }
        let now = Instant::now();
        while let Some(Reverse((due, id))) = held.peek().copied() {
            if due > now {
                break;
            }
            held.pop();
            if let Some(msg) = messages.remove(&id) {
                q.verdict(msg)?;
            }
        }
        if !got {
            let wait = held
                .peek()
                .map(|Reverse((due, _))| due.saturating_duration_since(now))
                .unwrap_or(IDLE)
                .min(IDLE);
            std::thread::sleep(wait);
        }
    }
    // Release everything still held before leaving.
    for (_, msg) in messages.drain() {
        let _ = q.verdict(msg);
    }
    let _ = q.unbind(queue);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_times_stay_within_delay_plus_minus_jitter_and_follow_the_seed() {
        let mut a = Hold::new(Duration::from_millis(5), Duration::from_millis(2), 7);
        let mut b = Hold::new(Duration::from_millis(5), Duration::from_millis(2), 7);
        let draws: Vec<Duration> = (0..1000).map(|_| a.draw()).collect();
        assert!(
            draws
                .iter()
                .all(|d| (Duration::from_millis(3)..=Duration::from_millis(7)).contains(d))
        );
        assert_eq!(draws, (0..1000).map(|_| b.draw()).collect::<Vec<_>>());
        let mean = draws.iter().sum::<Duration>() / 1000;
        assert!(
            (Duration::from_micros(4_800)..Duration::from_micros(5_200)).contains(&mean),
            "{mean:?}"
        );
        let mut fixed = Hold::new(Duration::from_millis(10), Duration::ZERO, 1);
        assert_eq!(fixed.draw(), Duration::from_millis(10));
    }
}
