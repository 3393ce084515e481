//! Capture rules inside a pod's network namespace (iptables, nat table).
//!
//! ```text
//!   OUTPUT     -p tcp -> FERRY_OUT:  marked by the proxy -> RETURN
//!                                     to 127.0.0.0/8      -> RETURN
//!                                     anything else       -> REDIRECT :15001 (outbound)
//!   PREROUTING -p tcp -> FERRY_IN:   to :15008 (HBONE)   -> RETURN (served directly)
//!                                     anything else       -> REDIRECT :15006 (inbound plain)
//! ```
//! Rules live in their own chains so removal is exact and leaves the pod's own rules alone.

use std::path::Path;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use ferry_runtime::netns::MARK;

pub(crate) use ferry_core::ports::{HBONE_PORT, INBOUND_PORT, OUTBOUND_PORT};

/// Why rules could not be changed.
#[derive(Debug, thiserror::Error)]
#[error("iptables in {netns}: {detail}")]
pub(crate) struct CaptureError {
    pub netns: String,
    pub detail: String,
}

fn rules() -> String {
    format!(
        "*nat\n\
         :FERRY_OUT - [0:0]\n\
         :FERRY_IN - [0:0]\n\
         -A FERRY_OUT -m mark --mark {MARK:#x}/0xfff -j RETURN\n\
         -A FERRY_OUT -d 127.0.0.0/8 -j RETURN\n\
         -A FERRY_OUT -p tcp -j REDIRECT --to-ports {OUTBOUND_PORT}\n\
         -A FERRY_IN -p tcp --dport {HBONE_PORT} -j RETURN\n\
         -A FERRY_IN -p tcp -j REDIRECT --to-ports {INBOUND_PORT}\n\
         -A OUTPUT -p tcp -j FERRY_OUT\n\
         -A PREROUTING -p tcp -j FERRY_IN\n\
         COMMIT\n"
    )
}

/// Installs the capture rules. Rules already in place (a previous node proxy's, during a
/// handover) are kept as they are: removing and adding them again would open a window in which
/// the pod's traffic bypasses the proxy.
pub(crate) async fn install(netns: &Path) -> Result<(), CaptureError> {
    // Queued connections of a closing listener move to the other listeners of its port group
    // (the next node proxy's) instead of being reset.
    let _ = Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["sysctl", "-q", "-w", "net.ipv4.tcp_migrate_req=1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await;
    if installed(netns).await {
        return Ok(());
    }
    remove(netns).await;
    let err = |detail: String| CaptureError {
        netns: netns.display().to_string(),
        detail,
    };
    let mut child = Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["iptables-restore", "--noflush"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| err(format!("cannot run nsenter/iptables-restore: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(rules().as_bytes())
            .await
            .map_err(|e| err(e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| err(e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(err(String::from_utf8_lossy(&out.stderr).trim().to_string()))
    }
}

/// Removes the capture rules; missing rules are not an error.
pub(crate) async fn remove(netns: &Path) {
    let ipt = |args: &[&str]| {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", netns.display()))
            .arg("iptables")
            .args(["-w", "-t", "nat"])
            .args(args);
        c.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        c
    };
    for (chain, hook) in [("FERRY_OUT", "OUTPUT"), ("FERRY_IN", "PREROUTING")] {
        // Delete every jump (a crashed earlier run may have left several).
        for _ in 0..8 {
            match ipt(&["-D", hook, "-p", "tcp", "-j", chain]).status().await {
                Ok(s) if s.success() => {}
                _ => break,
            }
        }
        let _ = ipt(&["-F", chain]).status().await;
        let _ = ipt(&["-X", chain]).status().await;
    }
}

/// Whether both jumps into Ferry's chains are in place.
pub(crate) async fn installed(netns: &Path) -> bool {
    let mut ok = true;
    for (chain, hook) in [("FERRY_OUT", "OUTPUT"), ("FERRY_IN", "PREROUTING")] {
        let status = Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .args([
                "iptables", "-w", "-t", "nat", "-C", hook, "-p", "tcp", "-j", chain,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .await;
        ok &= status.is_ok_and(|s| s.success());
    }
    ok
}
