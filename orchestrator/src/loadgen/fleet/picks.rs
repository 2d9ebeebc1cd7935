//! A scheduled kill's question to the generator processes while their
//! load runs: how many calls has your pool of this entry hop sent to this
//! replica so far? (`run::kills` counts the calls sent to a replica while
//! it was down from the answers at the kill and at the restart.) Each
//! running generator answers over its frame connection; one done already
//! answers with its final view; one gone does not.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::State;

/// How long an asker waits for the answers: generators answer at once,
/// and one that says nothing for [`super::SILENCE`] is taken for gone.
const PATIENCE: Duration = Duration::from_secs(3);

/// Asks the generators of a running load about their picks.
#[derive(Clone, Debug)]
pub(crate) struct PicksAsker(mpsc::Sender<Ask>);

impl PicksAsker {
    /// A new asker, and the fleet's end of it.
    pub(super) fn new() -> (PicksAsker, Asks) {
        let (tx, rx) = mpsc::channel(8);
        (
            PicksAsker(tx),
            Asks {
                rx: Some(rx),
                seq: 0,
                open: Vec::new(),
            },
        )
    }

    /// Each generator's calls so far to `hop`'s `replica`, by its index,
    /// from those whose pool of `hop` has that replica; `None` when the
    /// load is over or the answers did not come within [`PATIENCE`].
    pub(crate) async fn picks(&self, hop: &str, replica: u32) -> Option<Vec<(u32, u64)>> {
        let (reply, answers) = oneshot::channel();
        let ask = Ask {
            hop: hop.to_owned(),
            replica,
            reply,
        };
        self.0.send(ask).await.ok()?;
        tokio::time::timeout(PATIENCE, answers).await.ok()?.ok()
    }
}

/// One question, as the fleet takes it.
#[derive(Debug)]
pub(super) struct Ask {
    pub(super) hop: String,
    pub(super) replica: u32,
    reply: oneshot::Sender<Vec<(u32, u64)>>,
}

/// The questions the fleet is answering.
#[derive(Debug)]
pub(super) struct Asks {
    /// `None` once no asker is left.
    rx: Option<mpsc::Receiver<Ask>>,
    seq: u32,
    open: Vec<Open>,
}

/// A question sent to the generators and not yet answered by all.
#[derive(Debug)]
struct Open {
    seq: u32,
    ask: Ask,
    /// The generators (by position) that were asked and have not answered.
    waiting: Vec<usize>,
    answers: Vec<(u32, u64)>,
}

impl Asks {
    /// The fleet's end of no asker: never asked.
    pub(super) fn none() -> Asks {
        Asks {
            rx: None,
            seq: 0,
            open: Vec::new(),
        }
    }

    /// The next question; pending for ever once no asker is left.
    pub(super) async fn next(&mut self) -> Ask {
        if let Some(rx) = &mut self.rx {
            if let Some(ask) = rx.recv().await {
                return ask;
            }
            self.rx = None;
        }
        std::future::pending().await
    }

    /// The number the next question is sent with.
    pub(super) fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// `ask` was sent as `seq` to the generators at `waiting`.
    pub(super) fn sent(&mut self, seq: u32, ask: Ask, waiting: Vec<usize>) {
        self.open.push(Open {
            seq,
            ask,
            waiting,
            answers: Vec::new(),
        });
    }

    /// The generator at position `k`, index `index`, answered question
    /// `seq` with `picks`.
    pub(super) fn answered(&mut self, seq: u32, k: usize, index: u32, picks: Option<u64>) {
        if let Some(open) = self.open.iter_mut().find(|o| o.seq == seq)
            && let Some(at) = open.waiting.iter().position(|w| *w == k)
        {
            open.waiting.swap_remove(at);
            open.answers.extend(picks.map(|p| (index, p)));
        }
    }

    /// Stops waiting for generators no longer running (one done answers
    /// with its final view), and replies to every question answered by
    /// all it waits for.
    pub(super) fn settle(&mut self, states: &[State]) {
        if self.open.is_empty() {
            return;
        }
        for open in &mut self.open {
            open.waiting.retain(|&k| {
                let s = &states[k];
                if s.running() {
                    return true;
                }
                let last = s
                    .done
                    .iter()
                    .flat_map(|d| &d.endpoints)
                    .find_map(|view| view.picks_of(&open.ask.hop, open.ask.replica));
                open.answers.extend(last.map(|picks| (s.index, picks)));
                false
            });
        }
        let (answered, open): (Vec<Open>, Vec<Open>) = std::mem::take(&mut self.open)
            .into_iter()
            .partition(|o| o.waiting.is_empty());
        self.open = open;
        for mut o in answered {
            o.answers.sort_unstable();
            // An asker that gave up is not waiting.
            let _ = o.ask.reply.send(o.answers);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::frame::GeneratorOutcome;
    use super::*;
    use crate::analysis::{CallerEndpoints, ReplicaCounts};

    /// A generator done, its pool of `a` having sent `picks` calls to
    /// replica 1.
    fn done(picks: u64) -> GeneratorOutcome {
        let counts = |picks| ReplicaCounts {
            picks,
            ..ReplicaCounts::default()
        };
        GeneratorOutcome {
            warmup: Default::default(),
            measured: Duration::from_secs(1),
            interrupted: false,
            links: None,
            instrument: None,
            records: 0,
            peak_in_flight: 0,
            traced: 0,
            streams: None,
            endpoints: vec![CallerEndpoints {
                caller: "loadgen/2".to_owned(),
                hop: "a".to_owned(),
                replicas: vec![counts(40), counts(picks)],
                events: Vec::new(),
                dropped: 0,
            }],
        }
    }

    #[tokio::test]
    async fn the_running_answer_a_done_one_with_its_final_view_a_gone_one_not_at_all() {
        let (asker, mut asks) = PicksAsker::new();
        let question = tokio::spawn(async move { asker.picks("a", 1).await });
        let ask = asks.next().await;
        assert_eq!((ask.hop.as_str(), ask.replica), ("a", 1));
        let seq = asks.next_seq();
        let mut states: Vec<State> = (0..4)
            .map(|i| State::of(i, 100 + i, format!("g{i}.log"), 0, 0))
            .collect();
        asks.sent(seq, ask, vec![0, 1, 2, 3]);
        asks.answered(seq, 0, 0, Some(7));
        // Another question's answer is not this one's.
        asks.answered(seq.wrapping_add(1), 1, 1, Some(99));
        // Generator 1 pushes to no such replica.
        asks.answered(seq, 1, 1, None);
        asks.settle(&states);
        assert_eq!(asks.open.len(), 1, "still waiting for generators 2 and 3");
        states[2].done = Some(done(5));
        states[3].gone = Some("its connection ended".to_owned());
        asks.settle(&states);
        assert!(asks.open.is_empty());
        let answers = question.await.expect("the asker's task");
        assert_eq!(answers, Some(vec![(0, 7), (2, 5)]));
    }

    #[tokio::test]
    async fn an_asker_whose_load_is_over_gets_nothing() {
        let (asker, asks) = PicksAsker::new();
        drop(asks);
        assert_eq!(asker.picks("a", 0).await, None);
        let (asker, mut asks) = PicksAsker::new();
        let question = tokio::spawn(async move { asker.picks("a", 0).await });
        let ask = asks.next().await;
        let seq = asks.next_seq();
        asks.sent(seq, ask, vec![0]);
        // The fleet ends with the question open: it is let go unanswered.
        drop(asks);
        assert_eq!(question.await.expect("the asker's task"), None);
    }
}
