//! Compiles the KServe v2 gRPC protocol (`proto/`) for the `grpc` module: server code only,
//! the raw tensor payloads as `bytes::Bytes` so they are not copied.

fn main() {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .generate_default_stubs(true)
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        .compile_protos(&["proto/kserve.proto"], &["proto"])
        .unwrap_or_else(|e| {
            panic!("cannot compile the KServe protocol (is protoc installed?): {e}")
        });
}
