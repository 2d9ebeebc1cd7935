//! The test harness of this binary: libtest's command line and output
//! (through libtest-mimic), plus skips that say why.
//!
//! A test that cannot run here (no root, no Chromium, no Compose plugin)
//! calls [`skip`] with the reason. The test is then reported as `ignored
//! (reason)`, counted among the ignored in the summary line, and listed
//! again after it, so a plain `cargo test` shows what did not run and
//! why. With `TAILMESH_REQUIRE_ALL=1` (CI) a skip is a failure instead.
//! A part of a test left by design to another run of it (the netem guest
//! leaves to the host what needs the host's speed) is noted with
//! [`part_checked_elsewhere`] and listed after the summary line too.
//!
//! Tests are registered per module with [`tests!`]; a test in this
//! binary checks that no test function was left out of its module's list.
//! A test registered as a `tier` of its own (the netem guest: minutes of
//! emulation) is left out of the default run, keeping `cargo test
//! --workspace` within its time budget, and runs when asked for with
//! `-- --ignored` (`.ci/run` does); the summary names it and how to run it.

use std::{
    fmt::Display,
    panic::{AssertUnwindSafe, catch_unwind},
    path::Path,
    process::ExitCode,
    sync::{Mutex, OnceLock},
};

use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// The variable that turns every skip into a failure.
pub(crate) const REQUIRE_ALL: &str = "TAILMESH_REQUIRE_ALL";

/// Whether skips are failures: `TAILMESH_REQUIRE_ALL` set to anything but
/// empty or `0`.
pub(crate) fn skips_forbidden() -> bool {
    std::env::var_os(REQUIRE_ALL).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Ends the calling test as skipped with `reason`, or fails it when
/// skips are forbidden.
pub(crate) fn skip(reason: impl Display) -> ! {
    if skips_forbidden() {
        panic!("{reason}; {REQUIRE_ALL}=1 turns this skip into a failure");
    }
    std::panic::panic_any(Skip(reason.to_string()))
}

/// Ends the calling test as skipped because the machine was too busy to
/// judge what it measures (a verdict the instrument itself called
/// inconclusive). Reported and listed like every skip, but never turned
/// into a failure: `TAILMESH_REQUIRE_ALL` asks for every capability a
/// test needs, and a quiet machine is not one CI can install.
pub(crate) fn skip_busy(reason: impl Display) -> ! {
    std::panic::panic_any(Skip(format!("busy machine: {reason}")))
}

/// The payload of a skip, told apart from a failure's panic.
struct Skip(String);

/// Notes that the rest of the calling test is left, by design, to another
/// run of the same test (the netem guest leaves what needs the host's
/// speed to the host), for the list after the summary line. Not a skip:
/// the test goes on and passes or fails on what it checked, whatever
/// `TAILMESH_REQUIRE_ALL` says. A part this machine lacks something for
/// is a [`skip`].
pub(crate) fn part_checked_elsewhere(reason: impl Display) {
    let test = running();
    eprintln!("part left to another run: {reason}");
    ELSEWHERE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((test, reason.to_string()));
}

thread_local! {
    /// The test running on this thread, for [`part_checked_elsewhere`].
    static RUNNING: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// The test running on the calling thread (`module::name`), or empty.
pub(crate) fn running() -> String {
    RUNNING.with(|name| name.borrow().clone())
}

/// Parts of tests left to another run, with their reasons.
static ELSEWHERE: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// When a registered test runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum When {
    /// In every run.
    Always,
    /// Only when asked for by name (a helper process of another test).
    Helper,
    /// Only with `--ignored` or `--include-ignored`: a tier of its own.
    Tier,
}

/// One registered test.
pub(crate) struct Test {
    module: &'static str,
    name: &'static str,
    run: fn(),
    when: When,
}

impl Test {
    pub(crate) const fn new(
        module: &'static str,
        name: &'static str,
        run: fn(),
        when: When,
    ) -> Test {
        Test {
            module,
            name,
            run,
            when,
        }
    }

    /// `module::name`, the module path without the crate's own name.
    fn full_name(&self) -> String {
        let module = self.module.split_once("::").map_or("", |(_, m)| m);
        format!("{module}::{}", self.name)
    }
}

/// Registers a module's tests as `TESTS`: `sync name` for a plain
/// function, `tokio name` for an async one (run on a current-thread
/// runtime, as `#[tokio::test]` does, running alone: these start
/// processes of their own), `helper name` for an async
/// function that runs only when named with `--ignored --exact`, `tier
/// name` for a plain function that runs only with `--ignored` (a tier of
/// its own, outside the default run).
macro_rules! tests {
    (@one sync $name:ident) => {
        $crate::harness::Test::new(
            module_path!(),
            stringify!($name),
            $name,
            $crate::harness::When::Always,
        )
    };
    (@one tokio $name:ident) => {
        $crate::harness::Test::new(
            module_path!(),
            stringify!($name),
            || {
                let _turn = $crate::support::serial();
                $crate::harness::block_on($name())
            },
            $crate::harness::When::Always,
        )
    };
    (@one helper $name:ident) => {
        $crate::harness::Test::new(
            module_path!(),
            stringify!($name),
            || $crate::harness::block_on($name()),
            $crate::harness::When::Helper,
        )
    };
    (@one tier $name:ident) => {
        $crate::harness::Test::new(
            module_path!(),
            stringify!($name),
            $name,
            $crate::harness::When::Tier,
        )
    };
    ($($kind:ident $name:ident),* $(,)?) => {
        pub(crate) const TESTS: &[$crate::harness::Test] = &[$(tests!(@one $kind $name)),*];
    };
}

/// Runs `future` to completion on a current-thread runtime with time and
/// I/O enabled.
pub(crate) fn block_on<F: Future<Output = ()>>(future: F) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(future);
}

tests! {
    sync every_test_function_is_registered,
}

/// Every registered test's full name, for the registration check.
static REGISTERED: OnceLock<Vec<(String, String)>> = OnceLock::new();

/// The tests that skipped, with their reasons, for the closing list.
static SKIPPED: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// Parses libtest's command line, runs `groups`, prints the skipped tests
/// after the summary line, and returns libtest's exit code.
pub(crate) fn main(groups: &[&'static [Test]]) -> ExitCode {
    let mut args = Arguments::from_args();
    if args.test_threads.is_none() {
        // End-to-end tests mostly wait on their runs: a thread more than
        // the tests that may share the machine (support::SHARED_TURNS) lets
        // them overlap on 2 cores. RUST_TEST_THREADS is honoured, as
        // libtest does.
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        args.test_threads = Some(
            std::env::var("RUST_TEST_THREADS")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(cores.max(crate::support::SHARED_TURNS + 1)),
        );
    }
    let tests: Vec<&'static Test> = groups.iter().flat_map(|g| g.iter()).collect();
    let _ = REGISTERED.set(
        tests
            .iter()
            .map(|t| {
                let module = t.module.rsplit("::").next().unwrap_or_default();
                (module.to_owned(), t.name.to_owned())
            })
            .collect(),
    );
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // A skip is reported by the harness, not as a panic.
        if info.payload().downcast_ref::<Skip>().is_none() {
            default_hook(info);
        }
    }));
    let trials = tests.iter().map(|t| trial(t)).collect();
    let tiers_left: Vec<String> = if args.list || args.ignored || args.include_ignored {
        Vec::new()
    } else {
        tests
            .iter()
            .filter(|t| t.when == When::Tier)
            .map(|t| t.full_name())
            .filter(|name| {
                args.filter.as_deref().is_none_or(|f| {
                    if args.exact {
                        name == f
                    } else {
                        name.contains(f)
                    }
                })
            })
            .collect()
    };
    let conclusion = libtest_mimic::run(&args, trials);
    if !tiers_left.is_empty() {
        println!(
            "{} test(s) of a tier of their own left out (counted as ignored above; \
             run them with `cargo test -p tailmesh --test it -- --ignored <name>`, as .ci/run does):",
            tiers_left.len()
        );
        for name in &tiers_left {
            println!("  {name}");
        }
    }
    let skipped = SKIPPED.lock().unwrap_or_else(|e| e.into_inner());
    if !skipped.is_empty() {
        println!(
            "{} skipped (counted as ignored above; {REQUIRE_ALL}=1 makes a skip a failure):",
            skipped.len()
        );
        for (name, reason) in skipped.iter() {
            println!("  skipped {name}: {reason}");
        }
    }
    let elsewhere = ELSEWHERE.lock().unwrap_or_else(|e| e.into_inner());
    if !elsewhere.is_empty() {
        println!("{} part(s) of tests left to another run:", elsewhere.len());
        for (name, reason) in elsewhere.iter() {
            println!("  {name}: {reason}");
        }
    }
    conclusion.exit_code()
}

fn trial(test: &'static Test) -> Trial {
    let name = test.full_name();
    let recorded = name.clone();
    Trial::ignorable_test(name, move || {
        RUNNING.with(|running| running.borrow_mut().clone_from(&recorded));
        match catch_unwind(AssertUnwindSafe(test.run)) {
            Ok(()) => Ok(Completion::Completed),
            Err(payload) => match payload.downcast::<Skip>() {
                Ok(skip) => {
                    SKIPPED
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((recorded, skip.0.clone()));
                    Ok(Completion::ignored_with(skip.0))
                }
                Err(payload) => {
                    let message = payload
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_else(|| "the test panicked".to_owned());
                    Err(Failed::from(message))
                }
            },
        }
    })
    .with_ignored_flag(test.when != When::Always)
}

/// The top-level test functions of a module's source: `fn name() {` or
/// `async fn name() {` at the start of a line.
fn test_functions(source: &str) -> Vec<String> {
    source
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("async ").unwrap_or(line);
            rest.strip_prefix("fn ")?
                .strip_suffix("() {")
                .filter(|name| name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
                .map(str::to_owned)
        })
        .collect()
}

/// Every test function in this binary's modules is registered, so none is
/// silently left out of the run.
fn every_test_function_is_registered() {
    let registered = REGISTERED.get().expect("main registered the tests");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it");
    let mut missing = Vec::new();
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("read tests/it") {
        let path = entry.expect("an entry").path();
        let Some(module) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("read a test module");
        for name in test_functions(&source) {
            seen += 1;
            if !registered.iter().any(|(m, n)| m == module && *n == name) {
                missing.push(format!("{module}::{name}"));
            }
        }
    }
    assert!(
        seen >= registered.len(),
        "{seen} test functions found in {}",
        dir.display()
    );
    assert!(
        missing.is_empty(),
        "test functions missing from their module's tests! list: {missing:?}"
    );
}
