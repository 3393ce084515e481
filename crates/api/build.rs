//! Generates the wire types from `proto/` with protox (a pure-Rust protobuf compiler), so the
//! build needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/citadel.proto",
        "proto/workload.proto",
        "proto/authorization.proto",
        "proto/discovery.proto",
        "proto/google/rpc/status.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    // BTreeMap for every map field: the encoding (and so a resource's version) must not depend
    // on hash order.
    tonic_prost_build::configure()
        .btree_map(".")
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
