//! Generates the wire types from `proto/` with protox (a pure-Rust protobuf compiler), so the
//! build needs no system `protoc`. With the `stock` feature, also Istio's upstream messages
//! without Ferry's extensions (`proto/stock/`), into `$OUT_DIR/stock`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/citadel.proto",
        "proto/workload.proto",
        "proto/authorization.proto",
        "proto/discovery.proto",
        "proto/zds.proto",
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

    if std::env::var_os("CARGO_FEATURE_STOCK").is_some() {
        let stock = [
            "proto/stock/workload.proto",
            "proto/stock/authorization.proto",
        ];
        for p in &stock {
            println!("cargo:rerun-if-changed={p}");
        }
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("stock");
        std::fs::create_dir_all(&out)?;
        let fds = protox::compile(stock, ["proto/stock"])?;
        tonic_prost_build::configure()
            .btree_map(".")
            .build_server(false)
            .build_client(false)
            .out_dir(out)
            .compile_fds(fds)?;
    }
    Ok(())
}
