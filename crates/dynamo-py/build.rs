//! Link options of the `_core` extension.
//!
//! Packed relative relocations (`DT_RELR`, `-z pack-relative-relocs`): the extension carries
//! about 62,000 relative relocations (vtables, static tables, pyo3's method definitions).
//! As classic `RELA` entries they are 24 bytes each, 1.5 MiB that the dynamic loader reads
//! into every process that imports `dynamo._core`; packed, they take a few KiB. That is 1.5
//! MiB less resident memory for each frontend and worker process and a faster `dlopen`.
//!
//! A library linked this way needs glibc 2.36 or later at run time (the linker adds a
//! `GLIBC_ABI_DT_RELR` version requirement), so the option is used only when the build
//! machine's glibc has it (the extension built here runs here; wheels for older systems are
//! built on those systems, e.g. in a manylinux image, where it is left out).
//! `DYNAMO_PACK_RELOCS=0` turns it off, `=1` forces it.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=DYNAMO_PACK_RELOCS");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let target_env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let wanted = match std::env::var("DYNAMO_PACK_RELOCS").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => target_os == "linux" && target_env == "gnu" && host_glibc_has_relr(),
    };
    if wanted {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether the build machine's glibc (`getconf GNU_LIBC_VERSION`, e.g. `glibc 2.36`) is 2.36
/// or later, the first release whose loader applies `DT_RELR`.
fn host_glibc_has_relr() -> bool {
    let Ok(out) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(version) = text.split_whitespace().nth(1) else {
        return false;
    };
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (2, 36)
}
