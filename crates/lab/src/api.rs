//! A client for a node proxy's enrollment API (a line protocol on a Unix socket).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::Context;

/// One request to a node proxy's enrollment API.
pub(crate) fn api_call(socket: &Path, line: &str) -> anyhow::Result<String> {
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    s.write_all(format!("{line}\n").as_bytes())?;
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer)?;
    Ok(answer)
}

/// The pods a node proxy serves: (uid, netns path).
pub(crate) fn api_list(socket: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"list\n")?;
    let mut out = Vec::new();
    for line in BufReader::new(s).lines() {
        let line = line?;
        if line == "end" {
            return Ok(out);
        }
        if let Some((u, p)) = line.split_once(' ') {
            out.push((u.to_string(), p.to_string()));
        }
    }
    anyhow::bail!("the list ended without `end`")
}
