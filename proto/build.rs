//! Generates the tonic/prost code from `proto/` with protox (pure Rust), so a
//! clean machine needs no protoc and no network at build time.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/gangway/raft/v1/raft.proto",
        "proto/gangway/admin/v1/admin.proto",
        "proto/gangway/v1/inventory.proto",
        "proto/gangway/v1/scheduler.proto",
        "proto/deviceplugin/v1beta1/api.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .codec_path("crate::codec::GangwayCodec")
        .compile_fds(descriptors)?;
    Ok(())
}
