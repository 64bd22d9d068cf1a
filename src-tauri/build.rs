//! Build script: lets the binaries find libmlx at run time without LD_LIBRARY_PATH, binds
//! OpenBLAS on Linux (the BLAS bundled with the mlx-cpu wheel is the slow reference one), and
//! with the `desktop` feature runs Tauri's build step (tauri.conf.json, icons, capabilities).
fn main() {
    #[cfg(feature = "desktop")]
    tauri_build::build();

    println!("cargo:rerun-if-env-changed=DEP_MLX_LIBDIR");
    if let Ok(libdir) = std::env::var("DEP_MLX_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
    }
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        // Linked ahead of libmlx so that its cblas/lapack symbols win the dynamic lookup.
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-l:libopenblas.so.0");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
