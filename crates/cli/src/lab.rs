//! `ferry lab`: the arguments and everything they run live in the `ferry-lab` crate; the
//! binary only parses them, and adds `ferry lab ui` (the mesh map is the binary's: the lab
//! crate sits below it).

use std::process::ExitCode;

pub(crate) use ferry_lab::cli::LabCommand;

/// `ferry lab`'s subcommands: the lab crate's, and `ui`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum LabCli {
    /// The mesh map of the running lab in the browser (the same as `ferry ui --lab`).
    Ui(crate::ui::LabUiArgs),
    #[command(flatten)]
    Lab(LabCommand),
}

pub(crate) fn run(cmd: LabCli) -> ExitCode {
    match cmd {
        LabCli::Ui(args) => crate::ui::run_lab(&args),
        LabCli::Lab(cmd) => ferry_lab::cli::run(cmd),
    }
}
