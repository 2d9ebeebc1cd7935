//! The network-fault tests (`netfaults`) again, in a virtual machine whose
//! kernel has tc netem: `.ci/netem/guest` boots Debian's packaged kernel
//! under qemu (emulated, TCG) with the host's root directory mounted over
//! 9p, and runs this very test binary there, filtered to `netfaults::`,
//! as root, with skips forbidden and [`NETEM_GUEST_ENV`] set, so every
//! fault must be applied with netem. The result comes back as the guest
//! script's exit status and its output in a directory under the target
//! directory (on the host's disk, which the guest writes through 9p).
//! Emulation is several times slower than the host, too slow for the
//! tests' loads with debug binaries: the guest runs the release
//! `tailmesh` in place of the debug one (this test runs `cargo build
//! --release` first: nothing to do when `.ci/run` has built it).
//!
//! Needs root (the guest mounts the host's root with passthrough), qemu
//! (`qemu-system-x86`), a static busybox (`busybox-static`), `cpio`,
//! `depmod` (`kmod`), and the kernel package from the apt sources; without
//! them it skips with a message (a failure under `TAILMESH_REQUIRE_ALL`).

use std::{
    os::unix::process::CommandExt,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    harness::skip,
    netfaults::{self, NETEM_GUEST_ENV},
    support::*,
};
use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};
use tailmesh_netfault::tool::{has_privilege, tool_available};

// Minutes of emulation: a tier of its own, outside `cargo test
// --workspace`; .ci/run runs it (`-- --ignored netem::`).
tests! {
    tier the_network_fault_tests_pass_in_a_guest_whose_kernel_has_netem,
}

/// The guest's whole run may not take longer (boot about 30 s; the tests
/// about 7 min with qemu on 60 % of one busy core).
const GUEST_DEADLINE: Duration = Duration::from_secs(20 * 60);

/// How much slower than the host the guest is taken to be: the network
/// fault tests' loads are that much lighter and longer there, and their
/// deadlines that much longer ([`SLOWDOWN_ENV`]). Measured: a 3-hop chain
/// at concurrency 1 untraced, p50 11 to 76 ms in the guest against about
/// 1 ms on the host; at 150 requests a second it fell behind (p50 4.3 s),
/// at 150 / 6 it kept up.
const GUEST_SLOWDOWN: u32 = 6;

/// `.ci/netem/guest` started in its own process group (qemu is its
/// child), the whole group killed if the test fails before it ends.
struct Guest(Child);

impl Drop for Guest {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = killpg(Pid::from_raw(self.0.id() as i32), Signal::SIGKILL);
            let _ = self.0.wait();
        }
    }
}

fn the_network_fault_tests_pass_in_a_guest_whose_kernel_has_netem() {
    if !has_privilege() {
        skip("needs root: the netem guest mounts the host's root directory with passthrough");
    }
    if !tool_available("qemu-system-x86_64") {
        skip("needs qemu-system-x86_64 (Debian package qemu-system-x86) for the netem guest");
    }
    let guest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/netem/guest");
    let prepared = Command::new(&guest)
        .arg("prepare")
        .stdin(Stdio::null())
        .output()
        .expect("run .ci/netem/guest prepare");
    if !prepared.status.success() {
        skip(format!(
            "no netem guest: {}",
            String::from_utf8_lossy(&prepared.stderr).trim()
        ));
    }
    // Emulated, the guest runs debug binaries too slowly for the tests'
    // loads: there the release binary stands in for the debug one (a bind
    // mount in the guest).
    let release = Path::new(TAILMESH)
        .parent()
        .and_then(Path::parent)
        .map(|target| target.join("release/tailmesh"))
        .expect("the target directory");
    // Built here (nothing to do when it is up to date, as in CI, which
    // builds it first).
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "tailmesh",
            "--bin",
            "tailmesh",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .expect("run cargo build --release");
    assert!(
        built.status.success() && release.exists(),
        "cargo build --release: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    // The guest is CPU-bound emulation: no mesh of another test beside it.
    let _serial = serial();
    // In the target's tmp folder, which the guest sees wherever the clone
    // lies (under /tmp it binds the clone back over its own /tmp).
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(tmp).expect("create the target's tmp directory");
    let dir = tempfile::tempdir_in(tmp).expect("a directory for the guest's results");
    let me = std::env::current_exe().expect("this test binary's path");
    let script = write(
        dir.path(),
        "run.sh",
        &format!(
            "export {NETEM_GUEST_ENV}=1 TAILMESH_REQUIRE_ALL=1 {SLOWDOWN_ENV}={GUEST_SLOWDOWN}\n\
             mount --bind '{}' '{TAILMESH}' || exit 1\n\
             tc -V\n\
             exec '{}' --test-threads 1 netfaults::\n",
            path_str(&release),
            path_str(&me)
        ),
    );
    let out = dir.path().join("out");
    let started = Instant::now();
    let mut run = Guest(
        Command::new(&guest)
            .arg("run")
            .args([&script, &out])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("start .ci/netem/guest run"),
    );
    let status = wait_until(
        started + GUEST_DEADLINE,
        later(|| {
            format!(
                "the netem guest to end; console:\n{}\noutput:\n{}",
                read_lossy(&out.join("console.log")),
                read_lossy(&out.join("output.log"))
            )
        }),
        || run.0.try_wait().expect("wait for the guest"),
    );
    let output = read_lossy(&out.join("output.log"));
    let console = read_lossy(&out.join("console.log"));
    let mut stderr = String::new();
    if let Some(mut err) = run.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut err, &mut stderr);
    }
    let took = started.elapsed();
    eprintln!("netem guest: {status} after {took:.0?}; its tests:\n{output}");
    assert!(
        status.success(),
        "the network-fault tests in the netem guest: {status}\n{stderr}\n--- output\n{output}\n--- console\n{console}"
    );
    // Every network-fault test ran there and passed (none filtered out or
    // skipped).
    let expected = netfaults::TESTS.len();
    assert!(
        output.contains(&format!(
            "test result: ok. {expected} passed; 0 failed; 0 ignored"
        )),
        "expected {expected} network-fault tests to pass in the guest:\n{output}"
    );
}
