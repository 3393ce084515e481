//! The node-local enrollment API: what a CNI plugin (or `ferry lab`) calls.
//!
//! A Unix stream socket; one request per line, one answer line each:
//!
//! ```text
//! add <pod uid> <path of the pod's network namespace>   -> ok | error: <reason>
//! del <pod uid>                                          -> ok | error: not enrolled
//! list                                                   -> <uid> <netns path>... then "end"
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

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
        ["add", uid, netns] => match node
            .enroll(
                uid,
                PodNetns::Path(PathBuf::from(netns)),
                Duration::from_secs(30),
            )
            .await
        {
            Ok(_) => {
                node.unserved
                    .lock()
                    .remove(&ferry_core::model::WorkloadUid::new(*uid));
                crate::enrollment::save(node);
                "ok\n".into()
            }
            Err(e) => format!("error: {e}\n"),
        },
        ["del", uid] => {
            let unserved = node
                .unserved
                .lock()
                .remove(&ferry_core::model::WorkloadUid::new(*uid))
                .is_some();
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
        _ => "error: expected `add <uid> <netns>`, `del <uid>` or `list`\n".into(),
    }
}
