//! The crate's public API cannot grow (or shrink) by accident: every item declared `pub`
//! in `src/` (types, functions, methods, constants, fields, variants of public enums,
//! re-exports, modules), listed from the source with `syn`, must be the list committed in
//! `tests/public-api.txt`. `unreachable_pub` (checked by clippy in CI) makes every `pub`
//! item reachable from outside, so this list is the API. After an intended change, run
//! `RATEMESH_BLESS=1 cargo test --test public_api` and commit the new list with it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use quote::ToTokens;
use syn::{ImplItem, Item, Visibility};

fn is_pub(v: &Visibility) -> bool {
    matches!(v, Visibility::Public(_))
}

/// Tell whether an item is compiled for tests only (`#[cfg(test)]`).
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs
        .iter()
        .any(|a| a.meta.to_token_stream().to_string().replace(' ', "") == "cfg(test)")
}

fn list_items(file: &str, prefix: &str, items: &[Item], out: &mut Vec<String>) {
    for item in items {
        match item {
            Item::Fn(f) if is_pub(&f.vis) && !is_test(&f.attrs) => {
                out.push(format!("{file}: fn {prefix}{}", f.sig.ident));
            }
            Item::Struct(s) if is_pub(&s.vis) && !is_test(&s.attrs) => {
                out.push(format!("{file}: struct {prefix}{}", s.ident));
                for (i, field) in s.fields.iter().enumerate() {
                    if is_pub(&field.vis) {
                        let name = field
                            .ident
                            .as_ref()
                            .map_or(i.to_string(), |n| n.to_string());
                        out.push(format!("{file}: field {prefix}{}::{name}", s.ident));
                    }
                }
            }
            Item::Enum(e) if is_pub(&e.vis) && !is_test(&e.attrs) => {
                out.push(format!("{file}: enum {prefix}{}", e.ident));
                for v in &e.variants {
                    out.push(format!("{file}: variant {prefix}{}::{}", e.ident, v.ident));
                }
            }
            Item::Trait(t) if is_pub(&t.vis) && !is_test(&t.attrs) => {
                out.push(format!("{file}: trait {prefix}{}", t.ident));
            }
            Item::Const(c) if is_pub(&c.vis) && !is_test(&c.attrs) => {
                out.push(format!("{file}: const {prefix}{}", c.ident));
            }
            Item::Static(s) if is_pub(&s.vis) && !is_test(&s.attrs) => {
                out.push(format!("{file}: static {prefix}{}", s.ident));
            }
            Item::Type(t) if is_pub(&t.vis) && !is_test(&t.attrs) => {
                out.push(format!("{file}: type {prefix}{}", t.ident));
            }
            Item::Use(u) if is_pub(&u.vis) && !is_test(&u.attrs) => {
                let tree = u.tree.to_token_stream().to_string().replace(' ', "");
                out.push(format!("{file}: use {prefix}{tree}"));
            }
            Item::Mod(m) if !is_test(&m.attrs) => {
                if is_pub(&m.vis) {
                    out.push(format!("{file}: mod {prefix}{}", m.ident));
                }
                if let Some((_, inner)) = &m.content {
                    list_items(file, &format!("{prefix}{}::", m.ident), inner, out);
                }
            }
            Item::Impl(i) if i.trait_.is_none() && !is_test(&i.attrs) => {
                let ty = i.self_ty.to_token_stream().to_string().replace(' ', "");
                for member in &i.items {
                    match member {
                        ImplItem::Fn(f) if is_pub(&f.vis) => {
                            out.push(format!("{file}: fn {prefix}{ty}::{}", f.sig.ident));
                        }
                        ImplItem::Const(c) if is_pub(&c.vis) => {
                            out.push(format!("{file}: const {prefix}{ty}::{}", c.ident));
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The public items of every source file but tests (`tests.rs` and `tests/` hold only
/// `#[cfg(test)]` modules) and the binary's entry point.
fn public_api() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let mut out = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if rel.ends_with("/tests.rs") || rel.contains("/tests/") || rel == "src/main.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{rel}: {e}"));
        list_items(&rel, "", &parsed.items, &mut out);
    }
    out.sort();
    out
}

#[test]
fn the_public_api_is_the_committed_list() {
    let listed = public_api();
    let mut text = String::new();
    for line in &listed {
        writeln!(text, "{line}").unwrap();
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/public-api.txt");
    if std::env::var_os("RATEMESH_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != text {
        let old: Vec<&str> = committed.lines().collect();
        let new: Vec<&str> = text.lines().collect();
        let added: Vec<&&str> = new.iter().filter(|l| !old.contains(l)).collect();
        let removed: Vec<&&str> = old.iter().filter(|l| !new.contains(l)).collect();
        panic!(
            "the public API changed:\n  added: {added:#?}\n  removed: {removed:#?}\n\
             if intended, run `RATEMESH_BLESS=1 cargo test --test public_api` and commit \
             tests/public-api.txt"
        );
    }
}
