//! What the control-plane tests share (`mod common;` in each): the binary under test, the
//! example topologies, a directory removed when the test ends and a child process killed when
//! it does, pass or fail. Each test binary uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// The `ferry` binary under test.
pub(crate) fn ferry() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
}

/// What `ferry <args> --state-dir <state>` prints; it must succeed.
pub(crate) fn output(args: &[&str], state: &Path) -> String {
    let o = ferry()
        .args(args)
        .arg("--state-dir")
        .arg(state)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// The path of `examples/<name>`.
pub(crate) fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
}

/// A directory removed when the test ends, pass or fail.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    /// `ferry-<what>-<pid>` under the temporary directory, made now.
    pub(crate) fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ferry-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// Writes `text` to `name` in the directory; its path.
    pub(crate) fn write(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process, killed and reaped when dropped.
pub(crate) struct Killed(pub(crate) Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
