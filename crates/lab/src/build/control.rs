//! The control plane: its trust bundle, `ferry control serve` in its namespace, and the join
//! tokens of the node proxies and gateways.

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::bail;

use super::Lab;
use crate::CONTROL_IP;
use crate::procs::{spawn, wait_for_log};
use crate::state::State;

/// The running control plane, as what joins the mesh needs it.
pub(super) struct Control {
    /// Its state directory.
    pub(super) dir: String,
    /// The trust bundle file.
    pub(super) bundle: String,
    /// Where it serves the CA and xDS.
    pub(super) listen: String,
}

// === impl Control ===

impl Control {
    /// The arguments that join a program to this control plane with the join token in
    /// `token_file`: its address, the token and the trust bundle.
    pub(super) fn join_args(&self, token_file: &str) -> [String; 6] {
        [
            "--control".into(),
            format!("https://{}", self.listen),
            "--token-file".into(),
            token_file.into(),
            "--bundle-file".into(),
            self.bundle.clone(),
        ]
    }
}

/// Writes the trust bundle, starts the control plane in `ctl` with the arguments that name its
/// source (`--topology FILE`, or the Kubernetes clusters) and waits until it serves.
pub(super) fn start(
    lab: &Lab<'_>,
    state: &mut State,
    ctl: &str,
    trust_domain: &str,
    source: &[String],
) -> anyhow::Result<Control> {
    let control_dir = format!("{}/control", lab.dir);
    let status = Command::new(&lab.exe)
        .args([
            "control",
            "bundle",
            "--state-dir",
            &control_dir,
            "--trust-domain",
            trust_domain,
        ])
        .stderr(Stdio::inherit())
        .output()?;
    if !status.status.success() {
        bail!("ferry control bundle failed");
    }
    let bundle = format!("{}/bundle.pem", lab.dir);
    std::fs::write(&bundle, &status.stdout)?;
    let control_log = lab.opts.state_dir.join("control.log");
    let listen = format!("{CONTROL_IP}:15012");
    let metrics_listen = format!("{CONTROL_IP}:15014");
    let mut args = vec![lab.exe.as_str(), "control", "serve"];
    args.extend(source.iter().map(String::as_str));
    args.extend([
        "--state-dir",
        &control_dir,
        "--listen",
        &listen,
        "--metrics-listen",
        &metrics_listen,
    ]);
    spawn(state, ctl, &args, &control_log)?;
    state.control_log = control_log.clone();
    state.control_addr = listen.clone();
    wait_for_log(
        "the control plane",
        Duration::from_secs(20),
        &control_log,
        "serving the CA and xDS",
    )?;
    Ok(Control {
        dir: control_dir,
        bundle,
        listen,
    })
}

/// A join token for `node` (`what` names it in the error), written to `token_file`.
pub(super) fn token(
    lab: &Lab<'_>,
    control: &Control,
    node: &str,
    what: &str,
    token_file: &str,
) -> anyhow::Result<()> {
    let token = Command::new(&lab.exe)
        .args([
            "control",
            "token",
            "--state-dir",
            &control.dir,
            "--node",
            node,
        ])
        .output()?;
    if !token.status.success() {
        bail!("ferry control token failed for {what}");
    }
    ferry_tls::secret_file::replace_private(token_file.as_ref(), &token.stdout)?;
    Ok(())
}
