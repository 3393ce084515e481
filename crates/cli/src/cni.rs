//! `ferry cni`: the CNI plugin (run by the container runtime, as `ferry-cni` in its CNI_PATH
//! or as `ferry cni plugin`) and `ferry cni agent`, the node agent beside the node proxy.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

/// The name the runtime runs the plugin by (the conflist's `type`): a link to this binary.
pub(crate) const PLUGIN_NAME: &str = "ferry-cni";

// Parsed once per process from the command line: the size of the agent's arguments beside the
// empty plugin variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, clap::Subcommand)]
pub(crate) enum CniCommand {
    /// The plugin, as the runtime runs it: CNI_COMMAND and the rest in the environment, the
    /// network configuration on stdin, the result on stdout.
    Plugin,
    /// The node agent: enrolls pods as Istio's labels say (with --node-name) or of the given
    /// namespaces, and hands them to the node proxy over ZDS.
    Agent(AgentArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct AgentArgs {
    /// Where the plugin asks (the conflist's `agent_socket`).
    #[arg(long, default_value = ferry_cni::spec::DEFAULT_AGENT_SOCKET)]
    plugin_socket: PathBuf,
    /// Where the node proxy connects (its `--zds-socket`; Istio's default path).
    #[arg(long, default_value = "/var/run/ztunnel/ztunnel.sock")]
    zds_socket: PathBuf,
    /// This node's name (on Kubernetes: `spec.nodeName`, from the downward API): the agent
    /// watches the cluster's Namespaces and this node's Pods and enrolls the pods labelled
    /// `istio.io/dataplane-mode=ambient`, or whose namespace is (`none` on a pod opts it out).
    #[arg(long, value_name = "NODE")]
    node_name: Option<String>,
    /// With --node-name: the cluster's kubeconfig (default: in-cluster, else ~/.kube/config).
    #[arg(long, value_name = "FILE", requires = "node_name")]
    kubeconfig: Option<PathBuf>,
    /// With --node-name: how long a new pod waits for the API server's watch to show it.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pod_wait_seconds: u64,
    /// A namespace whose pods are enrolled, as if labelled `istio.io/dataplane-mode=ambient`.
    /// Repeatable.
    #[arg(long = "namespace", value_name = "NAMESPACE")]
    namespaces: Vec<String>,
    /// Enroll the pods of every namespace but the --exclude-namespace ones.
    #[arg(long)]
    all_namespaces: bool,
    /// With --all-namespaces: a namespace left alone. Repeatable.
    #[arg(long = "exclude-namespace", value_name = "NAMESPACE", default_values_t = ["kube-system".to_string()])]
    excluded: Vec<String>,
    /// Where the enrolled pods are kept across restarts of the agent.
    #[arg(long, default_value = "/var/run/ferry/cni-pods.json")]
    state_file: PathBuf,
    /// With --node-name: the node's /proc (in a pod: the host's, mounted), where the agent finds
    /// the network namespaces of pods that started before it, by their IPs.
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    proc_dir: PathBuf,
}

/// Whether this process was started by the name of the plugin (the runtime runs it so).
pub(crate) fn started_as_plugin() -> bool {
    std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n == PLUGIN_NAME))
        .unwrap_or(false)
}

/// The plugin: its exit code is the CNI result's.
pub(crate) fn run_plugin() -> ExitCode {
    ExitCode::from(ferry_cni::plugin::run())
}

pub(crate) fn run(cmd: CniCommand) -> ExitCode {
    match cmd {
        CniCommand::Plugin => run_plugin(),
        CniCommand::Agent(args) => {
            let _logs = crate::logging::init();
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("ferry cni agent: {e}");
                    return ExitCode::from(2);
                }
            };
            let agent = async {
                let kubernetes = match args.node_name {
                    Some(node) => {
                        let client =
                            ferry_cni::agent::Kubernetes::client(args.kubeconfig.as_deref())
                                .await?;
                        let mut k = ferry_cni::agent::Kubernetes::new(client, node);
                        k.pod_wait = std::time::Duration::from_secs(args.pod_wait_seconds);
                        Some(k)
                    }
                    None => None,
                };
                let config = ferry_cni::agent::Config {
                    plugin_socket: args.plugin_socket,
                    zds_socket: args.zds_socket,
                    namespaces: args.namespaces.into_iter().collect(),
                    all_namespaces: args.all_namespaces,
                    excluded: args.excluded.into_iter().collect::<BTreeSet<_>>(),
                    state_file: args.state_file,
                    kubernetes,
                    proc_dir: args.proc_dir,
                };
                ferry_cni::agent::run(config).await
            };
            match rt.block_on(agent) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("ferry cni agent: {e:#}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
