//! Compiles examples/servers/echo.proto with protox (no `protoc` needed)
//! into a tonic server and client.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../servers/echo.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["../servers"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
