//! A pod's network namespace as the state file records it ([`crate::enrollment`]): where it
//! was mounted and what it was, and only that namespace is opened from it again.

use std::fs::File;
use std::path::PathBuf;

use ferry_runtime::netns::Netns;

/// A pod's network namespace as recorded: the path it was mounted at, and its identity (nsfs
/// device and inode) then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Recorded {
    pub(crate) path: PathBuf,
    pub(crate) id: (u64, u64),
}

/// An enrolled pod this process cannot serve, and why.
#[derive(Clone, Debug)]
pub(crate) struct Unserved {
    pub(crate) netns: Recorded,
    pub(crate) reason: String,
}

/// Why a recorded namespace cannot be served.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RestoreError {
    #[error("cannot open network namespace {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "network namespace {path} is not the one recorded (inode {now} against {recorded}): created again under the same name, it is not this pod's"
    )]
    Replaced {
        path: String,
        now: u64,
        recorded: u64,
    },
}

// === impl Recorded ===

impl Recorded {
    /// Opens the namespace at the recorded path, if it is still the one recorded.
    pub(crate) fn open(&self) -> Result<File, RestoreError> {
        let path = self.path.display().to_string();
        let file = File::open(&self.path).map_err(|source| RestoreError::Open {
            path: path.clone(),
            source,
        })?;
        let now = Netns::id_of(&file).map_err(|source| RestoreError::Open {
            path: path.clone(),
            source,
        })?;
        if now != self.id {
            return Err(RestoreError::Replaced {
                path,
                now: now.1,
                recorded: self.id.1,
            });
        }
        Ok(file)
    }
}
