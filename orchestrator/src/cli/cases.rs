//! `tailmesh cases`: labelled fault cases for root-cause analysis, made
//! by short runs of a scenario with one drawn fault each (the library's
//! `cases`), and `tailmesh cases score`: rankings of suspects scored
//! against the labels.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::{Args, Subcommand};
use tailmesh::cases::draw::{self, DrawPlan};
use tailmesh::cases::files::{self, CasesError};
use tailmesh::cases::rank::{self, Ranking};
use tailmesh::cases::score::{self, MethodScore};
use tailmesh::cases::series::{Series, SeriesAcc};
use tailmesh::cases::{self as lib, Entry, Index, Kind, Label};
use tailmesh::experiment::{self, RunCommand};
use tailmesh::output;
use tailmesh::say;
use tailmesh::scenario::{self, Launcher};

use super::CliError;

/// `tailmesh cases`.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct CasesArgs {
    #[command(subcommand)]
    score: Option<CasesCommand>,
    #[command(flatten)]
    make: MakeArgs,
}

#[derive(Subcommand)]
enum CasesCommand {
    /// Score rankings of suspected root causes against the cases' labels:
    /// tailmesh's, the two baselines' and any tool's (--ranking).
    Score(ScoreArgs),
}

/// Making cases.
#[derive(Args)]
struct MakeArgs {
    /// The scenario whose mesh the cases run (its first variant, or
    /// --variant).
    #[arg(required = true)]
    scenario: Option<PathBuf>,
    /// How many faults to inject (one run each).
    #[arg(long, default_value_t = 10)]
    count: usize,
    /// The fault kinds, taken in turn [default: every kind the scenario's
    /// launcher can carry: loss and delay need the netns launcher (root)].
    #[arg(long, value_delimiter = ',')]
    faults: Vec<String>,
    /// The seed the faults are drawn from.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where the cases go: an empty or new folder.
    #[arg(short = 'o', long = "out", required = true)]
    out: Option<PathBuf>,
    /// How long each case's load lasts after warmup; the fault's window
    /// starts in its second third.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "12s")]
    length: Duration,
    /// The variant to run (default the first).
    #[arg(long)]
    variant: Option<String>,
    /// Keep the scenario's whole-run faults as background noise (by
    /// default a case's mesh has no fault but its own).
    #[arg(long)]
    background: bool,
    /// Run every case on the netns launcher (root): what loss and delay
    /// cases need, for a scenario whose launcher is local.
    #[arg(long)]
    netns: bool,
}

/// Scoring.
#[derive(Args)]
struct ScoreArgs {
    /// The cases' folder (`tailmesh cases -o DIR`).
    dir: PathBuf,
    /// A folder of another tool's rankings, one file per case named after
    /// it (`case-007.json` or `.csv`, most suspect service first); may be
    /// given several times.
    #[arg(long)]
    ranking: Vec<PathBuf>,
    /// Rank every kept case again with this build's built-in methods
    /// (from each case's run and files) before scoring.
    #[arg(long)]
    rerank: bool,
}

/// Runs `tailmesh cases` or `tailmesh cases score`.
pub(crate) fn cases(args: CasesArgs) -> Result<(), CliError> {
    match args.score {
        Some(CasesCommand::Score(score)) => score_cases(score),
        None => make(args.make),
    }
}

fn failed(e: CasesError) -> CliError {
    CliError::Failed(e.into())
}

fn make(args: MakeArgs) -> Result<(), CliError> {
    let (Some(path), Some(out)) = (args.scenario.clone(), args.out.clone()) else {
        return Err(CliError::BadInput(anyhow!(
            "a scenario file and -o DIR are needed"
        )));
    };
    let (scenario, source) = scenario::load(&path)?;
    let variant = match &args.variant {
        Some(name) => scenario
            .variants
            .iter()
            .find(|v| v.name == *name)
            .ok_or_else(|| {
                CliError::BadInput(anyhow!("{}: no variant named {name:?}", path.display()))
            })?,
        None => scenario
            .variants
            .first()
            .ok_or_else(|| CliError::BadInput(anyhow!("{}: no variant", path.display())))?,
    };
    let privileged = tailmesh_netfault::tool::has_privilege();
    let networked = args.netns
        || variant.launcher == Launcher::Netns
        || (variant.launcher == Launcher::Auto && privileged);
    let kinds: Vec<Kind> = if args.faults.is_empty() {
        let kinds: Vec<Kind> = Kind::ALL
            .into_iter()
            .filter(|k| !k.is_network() || networked)
            .collect();
        if kinds.len() < Kind::ALL.len() {
            say!("cases: loss and delay left out: they need the netns launcher (--netns, as root)");
        }
        kinds
    } else {
        args.faults
            .iter()
            .map(|name| {
                Kind::parse(name.trim()).ok_or_else(|| {
                    CliError::BadInput(anyhow!(
                        "--faults: unknown kind {name:?}; the kinds are {}",
                        Kind::ALL.map(Kind::as_str).join(", ")
                    ))
                })
            })
            .collect::<Result<_, _>>()?
    };
    if kinds.iter().any(|k| k.is_network()) && !networked {
        return Err(CliError::BadInput(anyhow!(
            "--faults: loss and delay need the netns launcher: --netns (as root), or launcher = \
             \"netns\" in {}",
            path.display()
        )));
    }
    let steady = draw::steady(
        &scenario,
        variant,
        args.background,
        args.length,
        args.netns || kinds.iter().any(|k| k.is_network()),
    );
    let Some(base) = steady.variants.first() else {
        return Err(CliError::BadInput(anyhow!(
            "{}: no variant",
            path.display()
        )));
    };
    let faults = draw::draw(
        base,
        &DrawPlan {
            count: args.count,
            kinds: kinds.clone(),
            seed: args.seed,
            length: args.length,
            slow_threshold: steady.check.slow_threshold,
        },
    )
    .map_err(|e| CliError::BadInput(anyhow!("{}: {e}", path.display())))?;
    let hops: Vec<String> = base.hops.iter().map(|h| h.name.clone()).collect();
    let work = out.join(".runs");
    let mut index = Index {
        scenario: path.display().to_string(),
        variant: base.name.clone(),
        seed: args.seed,
        length_s: args.length.as_secs_f64(),
        background: args.background,
        kinds,
        services: hops.clone(),
        slow_threshold_us: steady.check.slow_threshold.as_micros() as u64,
        kept: 0,
        dropped: 0,
        cases: Vec::new(),
    };
    // A folder that holds cases made with the same settings goes on from
    // where they end (more cases, or an interrupted set finished).
    let made = resume(&out, &index)?;
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(out.join("runs"))
        .with_context(|| format!("create {}", out.join("runs").display()))
        .map_err(CliError::Failed)?;
    let width = (args.count.max(1) - 1).to_string().len().max(3);
    for (i, (old, fault)) in made.cases.iter().zip(&faults).enumerate() {
        if old.case != format!("case-{i:0width$}") || old.fault != *fault {
            return Err(CliError::BadInput(anyhow!(
                "{}: {} is not what this command draws as case {i}; the cases go into an empty \
                 or new folder",
                out.display(),
                old.case
            )));
        }
    }
    if !made.cases.is_empty() {
        say!(
            "cases: {} already in {}, going on from case {}",
            made.cases.len(),
            out.display(),
            made.cases.len()
        );
    }
    index = made;
    say!(
        "cases: {} injections into variant {} of {}, {} each, seed {}",
        args.count,
        base.name,
        path.display(),
        tailmesh_units::duration(args.length),
        args.seed
    );
    for (i, fault) in faults.iter().enumerate().skip(index.cases.len()) {
        let case = format!("case-{i:0width$}");
        // What an interrupted command left of this case.
        let _ = std::fs::remove_dir_all(out.join(&case));
        let _ = std::fs::remove_dir_all(out.join("runs").join(&case));
        let mut run = draw::apply(&steady, fault);
        run.name = case.clone();
        let text = format!(
            "# tailmesh cases, {case}: {} from {:.1}s to {:.1}s, the steady mesh of variant {} \
             (over the file below)\n{source}",
            fault.describe(),
            fault.start_s,
            fault.end_s,
            base.name
        );
        let mut finished = experiment::execute_scenario(
            &run,
            &text,
            &RunCommand::step(path.clone(), work.clone(), true),
        )?;
        finished.write()?;
        let report = finished
            .summary
            .variants
            .first()
            .ok_or_else(|| CliError::Failed(anyhow!("{case} measured no variant")))?;
        let verdict = lib::judge(&report.phases, fault, &run.check);
        let runs = out.join("runs").join(&case);
        std::fs::rename(&finished.dir, &runs)
            .with_context(|| format!("move {} to {}", finished.dir.display(), runs.display()))
            .map_err(CliError::Failed)?;
        let _ = std::fs::remove_dir_all(work.join(&case));
        say!(
            "{case}: {:<18} {}: {}",
            fault.describe(),
            if verdict.kept { "kept" } else { "dropped" },
            verdict.reason
        );
        if verdict.kept {
            let applied = report.fault_windows.iter().find(|w| w.hop == fault.service);
            let origin =
                hlog_start(&runs.join(output::hlog::file_name(&base.name))).map_err(failed)?;
            let label = Label {
                case: case.clone(),
                service: fault.service.clone(),
                replica: fault.replica,
                fault: fault.clone(),
                start_unix_s: origin + fault.start_s,
                end_unix_s: origin + fault.end_s,
                applied_at_s: applied.and_then(|w| w.applied_at_s),
                cleared_at_s: applied.and_then(|w| w.cleared_at_s),
                origin_unix_s: origin,
                verdict: verdict.clone(),
            };
            let seconds = report.measured_s.ceil() as usize;
            CaseFiles {
                dir: &out.join(&case),
                run: &runs,
                variant: &base.name,
                hops: &hops,
                label: &label,
                threshold: run.check.slow_threshold,
                seconds,
            }
            .materialize()
            .map_err(failed)?;
            index.kept += 1;
        } else {
            index.dropped += 1;
        }
        index.cases.push(Entry {
            case: case.clone(),
            fault: fault.clone(),
            verdict,
            run: format!("runs/{case}"),
        });
        files::write_json(&out.join("index.json"), &index).map_err(failed)?;
        if finished.interrupted {
            let _ = std::fs::remove_dir_all(&work);
            return Err(CliError::Interrupted);
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    say!(
        "cases: {} kept, {} dropped (the fault left the objective as it was) of {}; index at {}",
        index.kept,
        index.dropped,
        index.cases.len(),
        out.join("index.json").display()
    );
    say!("score them: tailmesh cases score {}", out.display());
    Ok(())
}

/// The cases already in `out`: none for a new or empty folder, those of
/// its index when they were made with `fresh`'s settings; otherwise the
/// folder is not for these cases.
fn resume(out: &Path, fresh: &Index) -> Result<Index, CliError> {
    if !std::fs::read_dir(out).is_ok_and(|mut d| d.next().is_some()) {
        return Ok(fresh.clone());
    }
    let file = out.join("index.json");
    let refuse = |why: String| {
        CliError::BadInput(anyhow!(
            "{}: {why}; the cases go into an empty or new folder, or one whose cases were made \
             with the same scenario, variant, seed, length, kinds and --background",
            out.display()
        ))
    };
    if !file.exists() {
        return Err(refuse("not empty, and no index.json".to_owned()));
    }
    let made: Index = files::read_json(&file).map_err(failed)?;
    let settings = |i: &Index| {
        (
            i.scenario.clone(),
            i.variant.clone(),
            i.seed,
            i.length_s,
            i.background,
            i.kinds.clone(),
            i.services.clone(),
            i.slow_threshold_us,
        )
    };
    if settings(&made) != settings(fresh) {
        return Err(refuse("its cases were made with other settings".to_owned()));
    }
    Ok(made)
}

/// A kept case's folder (`dir`), made from its run folder (`run`): what
/// its files are written from.
struct CaseFiles<'a> {
    dir: &'a Path,
    run: &'a Path,
    /// The run's variant, and the services of its mesh.
    variant: &'a str,
    hops: &'a [String],
    label: &'a Label,
    /// The objective's slow threshold.
    threshold: Duration,
    /// The measured run's length, whole seconds.
    seconds: usize,
}

impl CaseFiles<'_> {
    /// Writes the case's folder from its run folder.
    fn materialize(&self) -> Result<(), CasesError> {
        let CaseFiles {
            dir,
            run,
            variant,
            label,
            ..
        } = *self;
        std::fs::create_dir_all(dir.join("rankings")).map_err(CasesError::io(dir))?;
        files::write_whole(
            &dir.join("inject_time.txt"),
            format!("{}\n", label.start_unix_s.floor() as i64).as_bytes(),
        )?;

        // The traces, without what gives the fault away, as Jaeger and OTLP JSON.
        let mut jaeger = Vec::new();
        for n in 0.. {
            let name = tailmesh::traces::jaeger::file_name(n);
            let from = run.join(&name);
            if !from.exists() {
                break;
            }
            let to = dir.join(&name);
            files::copy_traces(&from, &to)?;
            jaeger.push(to);
        }
        let otlp = dir.join("traces.otlp.json");
        tailmesh::traces::otlp_json::write_from_jaeger(&jaeger, &otlp).map_err(|e| {
            CasesError::Bad {
                path: otlp.clone(),
                what: e.to_string(),
            }
        })?;

        // The processes' logs (not their configs).
        let logs = run.join("logs").join(variant);
        let into = dir.join("logs");
        std::fs::create_dir_all(&into).map_err(CasesError::io(&into))?;
        if let Ok(entries) = std::fs::read_dir(&logs) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                if Path::new(&name).extension().is_some_and(|e| e == "log") {
                    let to = into.join(&name);
                    std::fs::copy(entry.path(), &to).map_err(CasesError::io(&to))?;
                }
            }
        }
        let series = self.write_rankings()?;
        files::write_whole(
            &dir.join("metrics.csv"),
            series.csv(label.origin_unix_s).as_bytes(),
        )?;
        files::write_json(&dir.join("label.json"), label)
    }

    /// Writes the case's `rankings/`: tailmesh's from its run's requests, the
    /// baselines' from its metrics and its traces (the case folder's own);
    /// returns the metrics' series.
    fn write_rankings(&self) -> Result<Series, CasesError> {
        let CaseFiles {
            dir,
            run,
            variant,
            hops,
            label,
            threshold,
            seconds,
        } = *self;
        let window = (label.fault.start_s, label.fault.end_s);
        // One pass over the requests: the metrics and tailmesh's blame.
        let mut series = SeriesAcc::new(hops.to_vec());
        let mut blame = rank::Blame::new(hops.to_vec(), threshold, window);
        let requests = run.join("requests.csv");
        output::csv::for_each_request(&requests, |v, r| {
            if v == variant {
                series.record(&r);
                blame.record(&r);
            }
        })
        .map_err(|e| CasesError::Bad {
            path: requests.clone(),
            what: e.to_string(),
        })?;
        let processes = run.join(output::files::PROCESSES);
        let samples = if processes.exists() {
            files::read_processes(&processes, variant)?
        } else {
            Vec::new()
        };
        let queues_file = run.join(output::files::QUEUES);
        let queues = if queues_file.exists() {
            files::read_queues(&queues_file, variant)?
        } else {
            Vec::new()
        };
        let series = series.finish(seconds, &samples, &queues);
        let mut traces = Vec::new();
        for n in 0.. {
            let file = dir.join(tailmesh::traces::jaeger::file_name(n));
            if !file.exists() {
                break;
            }
            let input = std::fs::File::open(&file).map_err(CasesError::io(&file))?;
            let imported = tailmesh_import::read(
                tailmesh_import::Format::Jaeger,
                &file.display().to_string(),
                std::io::BufReader::new(input),
            )
            .map_err(|e| CasesError::Bad {
                path: file.clone(),
                what: e.to_string(),
            })?;
            traces.extend(imported.traces);
        }
        let rankings: [Ranking; 3] = [
            blame.finish(),
            rank::p99_rise(&series, window),
            rank::slow_own_time(
                hops,
                &traces,
                (label.start_unix_s, label.end_unix_s),
                threshold,
            ),
        ];
        std::fs::create_dir_all(dir.join("rankings")).map_err(CasesError::io(dir))?;
        for r in &rankings {
            files::write_json(&dir.join("rankings").join(format!("{}.json", r.method)), r)?;
        }
        Ok(series)
    }
}

/// Ranks every kept case again with this build's built-in methods.
fn rerank(dir: &Path, index: &Index) -> Result<(), CliError> {
    let threshold = Duration::from_micros(index.slow_threshold_us);
    for case in index.cases.iter().filter(|c| c.verdict.kept) {
        let folder = dir.join(&case.case);
        let run = dir.join(&case.run);
        let label: Label = files::read_json(&folder.join("label.json")).map_err(failed)?;
        let summary = experiment::read_run(&run).map_err(|e| CliError::Failed(e.into()))?;
        let seconds = summary
            .variants
            .first()
            .map_or(0, |v| v.measured_s.ceil() as usize);
        CaseFiles {
            dir: &folder,
            run: &run,
            variant: &index.variant,
            hops: &index.services,
            label: &label,
            threshold,
            seconds,
        }
        .write_rankings()
        .map_err(failed)?;
    }
    Ok(())
}

/// The wall-clock time of the end of warmup: the `.hlog`'s StartTime.
fn hlog_start(path: &Path) -> Result<f64, CasesError> {
    let text = std::fs::read_to_string(path).map_err(CasesError::io(path))?;
    text.lines()
        .find_map(|l| l.strip_prefix("#[StartTime: "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| CasesError::Bad {
            path: path.to_path_buf(),
            what: "no #[StartTime: ...] line".to_owned(),
        })
}

fn score_cases(args: ScoreArgs) -> Result<(), CliError> {
    let index: Index = files::read_json(&args.dir.join("index.json")).map_err(failed)?;
    if args.rerank {
        rerank(&args.dir, &index)?;
    }
    let kept: Vec<&Entry> = index.cases.iter().filter(|c| c.verdict.kept).collect();
    if kept.is_empty() {
        return Err(CliError::BadInput(anyhow!(
            "{}: no kept case to score ({} injections, none moved the objective)",
            args.dir.display(),
            index.cases.len()
        )));
    }
    let mut methods: Vec<(String, Option<PathBuf>)> =
        [rank::TAILMESH, rank::P99_RISE, rank::SLOW_OWN_TIME]
            .map(|m| (m.to_owned(), None))
            .to_vec();
    for dir in &args.ranking {
        if !dir.is_dir() {
            return Err(CliError::BadInput(anyhow!(
                "--ranking {}: not a folder",
                dir.display()
            )));
        }
        let name = dir.file_name().map_or_else(
            || dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        methods.push((name, Some(dir.clone())));
    }
    let mut scores: Vec<MethodScore> = Vec::new();
    for (method, dir) in &methods {
        let mut results = Vec::new();
        for case in &kept {
            let names = match dir {
                Some(dir) => files::read_ranking(dir, &case.case).map_err(failed)?,
                None => {
                    let file = args
                        .dir
                        .join(&case.case)
                        .join("rankings")
                        .join(format!("{method}.json"));
                    let r: Ranking = files::read_json(&file).map_err(failed)?;
                    Some(r.ranking.into_iter().map(|s| s.service).collect())
                }
            };
            let at = score::position(names.as_deref(), &case.fault.service);
            results.push((case.fault.kind, at, names.is_some()));
        }
        scores.push(score::score(method, &results));
    }
    let by_reason = |word: &str| {
        index
            .cases
            .iter()
            .filter(|c| !c.verdict.kept && c.verdict.reason.contains(word))
            .count()
    };
    say!(
        "cases: {} injections, {} kept, {} dropped ({} invisible, {} with the objective broken before)",
        index.cases.len(),
        kept.len(),
        index.cases.len() - kept.len(),
        by_reason("invisible"),
        by_reason("already broken")
    );
    say!(
        "{:<16} {:<14} {:>6} {:>6} {:>6} {:>6}",
        "method",
        "kind",
        "cases",
        "AC@1",
        "AC@3",
        "Avg@5"
    );
    for s in &scores {
        for k in &s.kinds {
            let unranked = if k.unranked > 0 {
                format!("  ({} without a ranking)", k.unranked)
            } else {
                String::new()
            };
            say!(
                "{:<16} {:<14} {:>6} {:>6.2} {:>6.2} {:>6.2}{unranked}",
                s.method,
                k.kind,
                k.cases,
                k.ac1,
                k.ac3,
                k.avg5
            );
        }
    }
    let file = args.dir.join("scores.json");
    files::write_json(
        &file,
        &serde_json::json!({
            "injections": index.cases.len(),
            "kept": kept.len(),
            "methods": scores,
        }),
    )
    .map_err(failed)?;
    say!("scores written to {}", file.display());
    Ok(())
}
