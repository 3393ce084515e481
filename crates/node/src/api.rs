//! The node-local enrollment API: what a CNI plugin (or `ferry lab`) calls.
//!
//! A Unix stream socket; one request per line, one answer line each:
//!
//! ```text
//! add <pod uid> <path of the pod's network namespace>   -> ok | error: <reason>
//! add <pod uid> <netns path> uncaptured=<port>,...     -> the same; those inbound ports of the
//!                                                         pod are left out of capture
//! del <pod uid>                                          -> ok | error: not enrolled
//! list                                                   -> <uid> <netns path>... then "end"
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::model::WorkloadUid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

use crate::capture::Uncaptured;
use crate::pods::PodNetns;
use crate::state::Node;

/// Serves the API on `path` (replacing a stale socket file).
pub(crate) async fn serve(node: Arc<Node>, path: PathBuf) -> std::io::Result<()> {
    let _ = std::fs::remove_file(&path);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let listener = UnixListener::bind(&path)?;
    loop {
        let (stream, _) = listener.accept().await?;
        let node = node.clone();
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut lines = BufReader::new(r).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let answer = handle(&node, &line).await;
                if w.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        });
    }
}

async fn handle(node: &Arc<Node>, line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["add", uid, netns, options @ ..] => {
            let uncaptured = match add_options(options) {
                Ok(u) => u,
                Err(answer) => return answer,
            };
            add(node, uid, netns, uncaptured).await
        }
        ["del", uid] => {
            let unserved = node
                .unserved
                .lock()
                .remove(&ferry_core::model::WorkloadUid::new(*uid))
                .is_some();
            node.uncaptured
                .lock()
                .remove(&ferry_core::model::WorkloadUid::new(*uid));
            if node.remove(uid).await || unserved {
                crate::enrollment::save(node);
                "ok\n".into()
            } else {
                "error: not enrolled\n".into()
            }
        }
        ["list"] => {
            let mut out: String = node
                .enrolled()
                .iter()
                .map(|(u, p)| format!("{u} {}\n", p.display()))
                .collect();
            out.push_str("end\n");
            out
        }
        _ => USAGE.into(),
    }
}

const USAGE: &str =
    "error: expected `add <uid> <netns> [uncaptured=<port>,...]`, `del <uid>` or `list`\n";

/// The options of an `add` after the netns path: none, or `uncaptured=<port>,...`; otherwise
/// the error answer.
fn add_options(options: &[&str]) -> Result<Uncaptured, String> {
    match options {
        [] => Ok(Uncaptured::default()),
        [word] => Uncaptured::parse(word).ok_or_else(|| {
            format!("error: expected `uncaptured=<port>,...` (not a proxy port), not {word:?}\n")
        }),
        _ => Err(USAGE.into()),
    }
}

/// `add`: enrolls the pod, leaving `uncaptured` out of its inbound capture. A pod enrolled
/// already keeps its rules: asking for other uncaptured ports needs a `del` first.
async fn add(node: &Arc<Node>, uid: &str, netns: &str, uncaptured: Uncaptured) -> String {
    let key = WorkloadUid::new(uid);
    if let Err(e) = node.set_uncaptured(&key, uncaptured) {
        return format!("error: {e}; `del` it first\n");
    }
    match node
        .enroll(
            uid,
            PodNetns::Path(PathBuf::from(netns)),
            Duration::from_secs(30),
        )
        .await
    {
        Ok(_) => {
            node.unserved.lock().remove(&key);
            crate::enrollment::save(node);
            "ok\n".into()
        }
        Err(e) => format!("error: {e}\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_takes_no_option_or_uncaptured_ports_and_refuses_anything_else() {
        assert_eq!(add_options(&[]), Ok(Uncaptured::default()));
        assert_eq!(
            add_options(&["uncaptured=18080,17778"]),
            Ok(Uncaptured::new(vec![17778, 18080]))
        );
        let refused = add_options(&["uncaptured=15006"]).unwrap_err();
        assert!(
            refused.starts_with("error: expected `uncaptured="),
            "{refused}"
        );
        assert!(add_options(&["extra"]).is_err());
        assert_eq!(
            add_options(&["uncaptured=1", "more"]),
            Err(USAGE.to_string())
        );
    }
}
