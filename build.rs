//! Embeds `migrations/`, `repairs/` and `release.toml` in the binary, so a release binary
//! carries its own release.
use std::{env, fs, path::Path};

fn embed(dir_name: &str, out: &str, name: &str) {
    let root = Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap()).to_path_buf();
    let dir = root.join(dir_name);
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut entries: Vec<_> = fs::read_dir(&dir)
        .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    entries.sort();
    let mut code = format!("pub static {name}: &[(&str, &[u8])] = &[\n");
    for path in entries.iter().filter(|p| p.is_file()) {
        println!("cargo:rerun-if-changed={}", path.display());
        let file = path.file_name().unwrap().to_string_lossy();
        code.push_str(&format!(
            "    ({file:?}, include_bytes!({:?})),\n",
            path.display().to_string()
        ));
    }
    code.push_str("];\n");
    fs::write(Path::new(&env::var("OUT_DIR").unwrap()).join(out), code).unwrap();
}

fn main() {
    embed("migrations", "embedded_migrations.rs", "EMBEDDED");
    embed("repairs", "embedded_repairs.rs", "EMBEDDED");
    let release = Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap()).join("release.toml");
    println!("cargo:rerun-if-changed={}", release.display());
}
