//! `ferry lab`: the arguments and everything they run live in the `ferry-lab` crate; the
//! binary only parses them.

pub(crate) use ferry_lab::cli::LabCommand;

pub(crate) fn run(cmd: LabCommand) -> std::process::ExitCode {
    ferry_lab::cli::run(cmd)
}
