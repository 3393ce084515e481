//! The control plane listens while its first resource set is still being encoded: a node that
//! connects at once must get that whole set as its first push, never the placeholder before it
//! (`XdsServer::with_first_set`).

use std::time::Duration;

use ferry_control::testing::control::Control;
use ferry_control::testing::sim::{Sim, SimConfig};

const WORKLOADS: usize = 10_000;
const SERVICES: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_connecting_as_soon_as_it_listens_gets_the_whole_first_set() {
    let text = ferry_control::testing::generated_topology(WORKLOADS, SERVICES, 0);
    let control = Control::start("first-set", &text).await.unwrap();
    let sim = SimConfig {
        addr: control.listening.addr,
        bundle_pem: control.bundle().unwrap(),
        token: control.token("node0").unwrap(),
        node: "node0".into(),
        window: None,
    };
    let mut node = Sim::connect(&sim, &[]).await.expect("the node connects");
    let first = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let r = node
                .next()
                .await
                .expect("a healthy stream")
                .expect("an open stream");
            if r.type_url.contains("Address") {
                return r;
            }
        }
    })
    .await
    .expect("the first address push within two minutes");
    // Every workload and every service, in the first push.
    assert_eq!(
        first.upserts,
        WORKLOADS + SERVICES,
        "{:?}",
        &first.names[..first.names.len().min(5)]
    );
    assert_eq!(first.removed, 0);
}
