//! Imports run one way: every module of `src/` names only modules of the
//! layers below its own (see ARCHITECTURE.md). Read from the sources, so a
//! new upward import fails here, with the file and the line.

use std::fs;
use std::path::{Path, PathBuf};

/// The top-level modules, from the facade down; a module may use those
/// after it in this list (and, within a row, those after it in the row).
const LAYERS: &[&str] = &[
    "locked",
    "client",
    "sync",
    "context",
    "lease",
    "parking",
    "client_name",
    "scripts",
    "identity",
    "keys",
    "backend",
    "config",
    "observe",
    "error",
];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| *layer == module)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None` for lib.rs).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib").then(|| name.to_owned())
}

#[test]
fn every_module_imports_only_from_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut upward = Vec::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let own = rank(&module)
            .unwrap_or_else(|| panic!("{module} (from {}) is not in LAYERS", file.display()));
        let text = fs::read_to_string(file).unwrap();
        for (number, line) in text.lines().enumerate() {
            for (at, _) in line.match_indices("crate::") {
                let rest = &line[at + "crate::".len()..];
                let used: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                let Some(used_rank) = rank(&used) else {
                    continue; // a re-export at the root, such as crate::Lock in docs
                };
                if used != module && used_rank <= own {
                    upward.push(format!(
                        "{}:{}: {module} uses {used}",
                        file.display(),
                        number + 1
                    ));
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the layering:\n{}",
        upward.join("\n")
    );
}
