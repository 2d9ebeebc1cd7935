//! What the orchestrator and its generator processes say to each other,
//! over one TCP connection per generator: length-prefixed JSON frames
//! (a 4-byte big-endian length, then the message).

use std::time::Duration;

use serde::{Deserialize, Serialize, de::DeserializeOwned};
use tailmesh_analysis::instrument::InstrumentReport;
use tailmesh_model::{BrokerKind, LinkCounts, QueueBounds};
use tailmesh_services::{addr::PeerAddr, hop::server::DownstreamConfig, tls::TlsFiles};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use super::super::{Part, StreamTally};
use crate::{
    record::{RequestRecord, StreamPlace, WarmupCounts},
    traces::loadgen::TraceIds,
};

/// The largest frame either side accepts: a batch of records is far
/// smaller; anything larger is a broken or foreign peer.
const MAX_FRAME: usize = 64 << 20;

/// What the orchestrator tells a generator.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ToGenerator {
    /// What to send, to whom.
    Job(Box<Job>),
    /// A clock probe: answered at once with the generator's wall clock.
    Ping { seq: u32 },
    /// Start the load's origin at this instant of the generator's own
    /// wall clock (ns since the Unix epoch).
    Start { at_unix_ns: u64 },
    /// The run was interrupted this many times (see `STOP_SENDING` and
    /// `ABANDON`).
    Stop { interrupts: u32 },
    /// How many calls its pool of entry hop `hop` has sent to `replica`
    /// so far (a scheduled kill counts the calls sent while the replica
    /// is down): answered with [`FromGenerator::Picks`] of the same
    /// `seq`.
    Picks { seq: u32, hop: String, replica: u32 },
    /// A generator that stays (`tailmesh generator --stay`): this variant
    /// needs no generator of its index; connect again for the next.
    Skip,
    /// A generator that stays: the run is over; exit.
    Bye,
}

/// A generator's share of a variant's load.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Job {
    /// Which part of the load it sends.
    pub part: Part,
    /// The variant's `[load]`.
    pub load: crate::scenario::Load,
    /// The entry hops, each as a caller reaches it, with its share.
    pub entries: Vec<(DownstreamConfig, f64)>,
    /// Shared connections per replica.
    pub channels: usize,
    /// The run's seed: the schedule, the entry draws, the pools' choices.
    pub seed: u64,
    /// The broker of pulled entries.
    pub broker: Option<(BrokerKind, QueueBounds, PeerAddr)>,
    /// The certificates it connects with, when the mesh runs TLS.
    pub tls: Option<TlsFiles>,
    /// The requests' trace identities, when traced.
    pub trace: Option<TraceIds>,
    /// The run holds its traces for its keep decisions: the orchestrator
    /// makes a kept request's client span from its record, so the
    /// generator forwards no span and only counts the traced requests
    /// ([`GeneratorOutcome::traced`]).
    #[serde(default)]
    pub held: bool,
}

/// What a generator tells the orchestrator.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum FromGenerator {
    /// Connected: which generator it is, and the deployment's token
    /// when it was given one (an orchestrator with a token admits no
    /// generator without it).
    Hello {
        index: u32,
        pid: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
    },
    /// The job is understood and its entries reached.
    Ready,
    /// The answer to a ping: the generator's wall clock, ns since the Unix
    /// epoch.
    Pong { seq: u32, unix_ns: u64 },
    /// The load's origin as set, on the generator's wall clock.
    Started { origin_unix_ns: u64 },
    /// Measured requests that ended, on the generator's measured clock.
    Records { records: Vec<RequestRecord> },
    /// Traced requests that ended (the warmup's too), for their spans.
    Spans { spans: Vec<ClientSpan> },
    /// Alive: requests sent and ended so far (warmup's included).
    Beat { sent: u64, ended: u64 },
    /// The answer to [`ToGenerator::Picks`]: `None` when it pushes to no
    /// such hop's replica.
    Picks { seq: u32, picks: Option<u64> },
    /// Its part of the load is over.
    Done(Box<GeneratorOutcome>),
    /// It could not do its job.
    Failed { error: String },
}

/// A traced request's client span, as the orchestrator records it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ClientSpan {
    pub id: u64,
    /// When it ended, on the generator's wall clock, ns since the epoch.
    pub ended_unix_ns: u64,
    /// From its intended send time to its end.
    pub latency: Duration,
    pub error: Option<String>,
    /// Which message of which stream it was, if one.
    #[serde(default)]
    pub stream: Option<StreamPlace>,
}

/// What a generator's part of the load came to.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct GeneratorOutcome {
    pub warmup: WarmupCounts,
    /// Its measured phase's length.
    pub measured: Duration,
    pub interrupted: bool,
    /// Its own connections.
    pub links: Option<LinkCounts>,
    /// Its self-watch, judged with its own sends' lateness.
    pub instrument: Option<InstrumentReport>,
    /// Measured records it sent on.
    pub records: u64,
    pub peak_in_flight: usize,
    /// Requests it traced (head-sampled, its warmup's included), counted
    /// here when its job was `held` (it forwarded no span to count).
    #[serde(default)]
    pub traced: u64,
    /// What became of its streams, when the load went on streams.
    #[serde(default)]
    pub streams: Option<StreamTally>,
    /// What its entry pools did with the entry hops' replicas, its events
    /// on its own measured clock.
    #[serde(default)]
    pub endpoints: Vec<crate::analysis::CallerEndpoints>,
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("the connection closed")]
    Closed,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("a frame of {0} bytes, over the limit of {MAX_FRAME}")]
    TooLarge(usize),
    #[error("a frame that is no message: {0}")]
    Json(#[from] serde_json::Error),
}

/// Writes one message.
pub(crate) async fn write<W: AsyncWrite + Unpin, M: Serialize>(
    w: &mut W,
    message: &M,
) -> Result<(), FrameError> {
    let body = serde_json::to_vec(message)?;
    if body.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(body.len()));
    }
    let len = u32::try_from(body.len()).map_err(|_| FrameError::TooLarge(body.len()))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one message; [`FrameError::Closed`] at a clean end of stream
/// between frames.
pub(crate) async fn read<R: AsyncRead + Unpin, M: DeserializeOwned>(
    r: &mut R,
) -> Result<M, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(serde_json::from_slice(&body)?)
}

/// Now on this machine's wall clock, ns since the Unix epoch.
pub(crate) fn unix_ns_now() -> u64 {
    tailmesh_units::unix_nanos_at(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Outcome;

    #[tokio::test]
    async fn messages_cross_as_sent_and_a_closed_stream_reads_as_closed() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let record = RequestRecord {
            id: 7,
            intended: Duration::from_micros(1_500),
            start: Duration::from_micros(1_510),
            end: Duration::from_micros(2_750),
            outcome: Outcome::Timeout,
            path: Vec::new(),
            extra_attempts: 1,
            attempts: Vec::new(),
            stream: None,
        };
        write(
            &mut a,
            &FromGenerator::Records {
                records: vec![record.clone()],
            },
        )
        .await
        .expect("write");
        write(&mut a, &FromGenerator::Beat { sent: 3, ended: 2 })
            .await
            .expect("write");
        drop(a);
        match read(&mut b).await.expect("read") {
            FromGenerator::Records { records } => assert_eq!(records, vec![record]),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            read(&mut b).await.expect("read"),
            FromGenerator::Beat { sent: 3, ended: 2 }
        ));
        assert!(matches!(
            read::<_, FromGenerator>(&mut b).await,
            Err(FrameError::Closed)
        ));
    }

    #[tokio::test]
    async fn an_oversized_length_is_refused_before_reading_its_body() {
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&u32::MAX.to_be_bytes()).await.expect("write");
        assert!(matches!(
            read::<_, FromGenerator>(&mut b).await,
            Err(FrameError::TooLarge(n)) if n == u32::MAX as usize
        ));
    }
}
