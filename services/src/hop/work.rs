//! Doing the planned work: waiting, or hashing as back-to-back's sim does.

use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use super::draw::PlannedWork;
use crate::timer::Sleeper;

/// Does `work`. CPU work runs on the calling thread: a replica is a
/// single-threaded server, so a long hash holds up the requests behind it,
/// which is what makes a slow replica hurt push callers.
pub async fn perform(work: PlannedWork, sleeper: &Sleeper) {
    match work {
        PlannedWork::Sleep(d) => sleeper.sleep(d).await,
        PlannedWork::Cpu {
            rounds,
            block_bytes,
        } => {
            std::hint::black_box(hash_rounds(rounds, block_bytes));
        }
    }
}

/// `rounds` SHA-256 passes over a `block_bytes` buffer, each pass seeded
/// with the previous digest so none can be skipped; returns the last digest.
pub fn hash_rounds(rounds: u32, block_bytes: usize) -> [u8; 32] {
    let block = block(block_bytes);
    let mut digest = [0u8; 32];
    for _ in 0..rounds {
        let mut h = Sha256::new();
        h.update(digest);
        h.update(block);
        digest = h.finalize().into();
    }
    digest
}

fn block(len: usize) -> &'static [u8] {
    static BLOCK: OnceLock<Vec<u8>> = OnceLock::new();
    let data = BLOCK.get_or_init(|| (0..16 * 1024 * 1024).map(|i| (i % 251) as u8).collect());
    &data[..len.min(data.len())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_chain_and_differ() {
        assert_eq!(hash_rounds(0, 1024), [0u8; 32]);
        let one = hash_rounds(1, 1024);
        let two = hash_rounds(2, 1024);
        assert_ne!(one, [0u8; 32]);
        assert_ne!(one, two);
        assert_eq!(two, hash_rounds(2, 1024));
    }
}
