//! Bounded waits for the binary: a test that runs something which could hang (a hung
//! driver call, a stuck read, a peer that never answers) waits at most [`WAIT`] and then
//! fails saying what never happened. These are hang guards, never speed targets: no
//! test asserts how fast the tool is (CI is a loaded 2-core machine).

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// The longest any test waits for the binary to exit.
pub const WAIT: Duration = Duration::from_secs(60);

/// Waits for `child` to exit, as `Child::wait` does, but kills it with SIGKILL and fails
/// the test if it has not exited within [`WAIT`].
pub fn wait_within(child: &mut Child, what: &str) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > WAIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} never exited within {WAIT:?} (killed)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `cmd` as `Command::output` does (stdin empty, stdout and stderr captured), but
/// kills it with SIGKILL and fails the test if it has not exited within [`WAIT`].
pub fn output_within(cmd: &mut Command, what: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: could not start: {e}"));
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let status = wait_within(&mut child, what);
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}
