//! The shape of the code, enforced: no file of the native runtime's `src/` over
//! [`MAX_NATIVE_FILE_LINES`] lines, no function outside tests over [`MAX_FN_LINES`] lines in
//! any crate's `src/`, and no module cycle inside a crate (module `a` uses `b` and `b` uses
//! `a`, directly or through others).
//!
//! The sources are read with a small lexer of our own (no parser dependency): comments,
//! strings and character literals are blanked first, so a brace or a `crate::` in them never
//! counts; items under `#[cfg(test)]` and `#[test]` functions are left out. A function's
//! length counts from its `fn` line to its closing brace.
//!
//! Module edges come from paths: `crate::x` (or a `crate::{x, ...}` group), a name the crate
//! root imports (`crate::Name` where the root has `pub use x::Name`), and `super::` chains that
//! climb out of a top-level module. Only top-level modules are nodes.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// The longest a file of `crates/smithers-runtime-native/src` may be.
const MAX_NATIVE_FILE_LINES: usize = 800;

/// The longest a function outside tests may be, in any crate's `src/`.
const MAX_FN_LINES: usize = 150;

// ---------------------------------------------------------------------------------------------
// Lexing
// ---------------------------------------------------------------------------------------------

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Blanks `chars[from..to]` to spaces, keeping newlines (so line numbers stay right).
fn blank(chars: &mut [char], from: usize, to: usize) {
    let to = to.min(chars.len());
    for c in &mut chars[from..to] {
        if *c != '\n' {
            *c = ' ';
        }
    }
}

/// The end (exclusive) of a block comment starting at `i` (`/*`), nested ones included.
fn block_comment_end(c: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    c.len()
}

/// The end (exclusive) of a raw string whose `r` is at `i`, or `None` if `r` starts no raw
/// string (`r#ident` or a plain identifier).
fn raw_string_end(c: &[char], i: usize) -> Option<usize> {
    let mut j = i + 1;
    let mut hashes = 0;
    while c.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < c.len() {
        if c[j] == '"' && (0..hashes).all(|h| c.get(j + 1 + h) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(c.len())
}

/// The end (exclusive) of a string whose opening quote is at `i`.
fn string_end(c: &[char], mut i: usize) -> usize {
    i += 1;
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    c.len()
}

/// The end (exclusive) of a character literal whose quote is at `i`, or `None` for a
/// lifetime or a label (`'a`, `'static`).
fn char_literal_end(c: &[char], i: usize) -> Option<usize> {
    if c.get(i + 1) == Some(&'\\') {
        let mut j = i + 3;
        while j < c.len() && c[j] != '\'' {
            j += 1;
        }
        return Some(j + 1);
    }
    (c.get(i + 2) == Some(&'\'')).then_some(i + 3)
}

/// The source with every comment, string and character literal blanked to spaces (newlines
/// kept), so that what is left is code.
fn code_only(src: &str) -> Vec<char> {
    let mut c: Vec<char> = src.chars().collect();
    let mut i = 0;
    while i < c.len() {
        let prev_ident = i > 0 && is_ident_char(c[i - 1]);
        let next = c.get(i + 1).copied();
        let end = match c[i] {
            '/' if next == Some('/') => {
                let mut j = i;
                while j < c.len() && c[j] != '\n' {
                    j += 1;
                }
                Some(j)
            }
            '/' if next == Some('*') => Some(block_comment_end(&c, i)),
            'r' if !prev_ident => raw_string_end(&c, i),
            'b' | 'c' if !prev_ident && next == Some('r') => raw_string_end(&c, i + 1),
            'b' | 'c' if !prev_ident && next == Some('"') => Some(string_end(&c, i + 1)),
            'b' if !prev_ident && next == Some('\'') => char_literal_end(&c, i + 1),
            '"' => Some(string_end(&c, i)),
            '\'' => char_literal_end(&c, i),
            _ => None,
        };
        match end {
            Some(end) => {
                blank(&mut c, i, end);
                i = end;
            }
            None if is_ident_char(c[i]) => {
                // Skip the rest of the word: an `r` or `b` inside it starts nothing.
                while i < c.len() && is_ident_char(c[i]) {
                    i += 1;
                }
            }
            None => i += 1,
        }
    }
    c
}

/// A word (identifier, keyword or number) or one punctuation character, with its line.
#[derive(Debug, Clone, PartialEq)]
struct Token {
    text: String,
    line: usize,
}

impl Token {
    fn is(&self, s: &str) -> bool {
        self.text == s
    }

    fn is_ident(&self) -> bool {
        self.text.chars().next().is_some_and(is_ident_char)
    }
}

fn tokens(src: &str) -> Vec<Token> {
    let code = code_only(src);
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < code.len() {
        let ch = code[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if is_ident_char(ch) {
            let start = i;
            while i < code.len() && is_ident_char(code[i]) {
                i += 1;
            }
            out.push(Token {
                text: code[start..i].iter().collect(),
                line,
            });
        } else {
            out.push(Token {
                text: ch.to_string(),
                line,
            });
            i += 1;
        }
    }
    out
}

/// The index of the bracket closing the one at `open` (`{`, `(` or `[`).
fn matching(t: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, tok) in t.iter().enumerate().skip(open) {
        match tok.text.as_str() {
            "{" | "(" | "[" => depth += 1,
            "}" | ")" | "]" => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    t.len() - 1
}

/// From `i`, the first `{` or `;` outside parentheses and brackets: where an item's body
/// starts, or where an item without one ends.
fn body_or_semicolon(t: &[Token], mut i: usize) -> usize {
    let mut depth = 0i32;
    while i < t.len() {
        match t[i].text.as_str() {
            "(" | "[" => depth += 1,
            ")" | "]" => depth -= 1,
            "{" | ";" if depth <= 0 => return i,
            _ => {}
        }
        i += 1;
    }
    t.len() - 1
}

/// Whether the attribute whose `[` is at `open` (closing at `close`) marks test-only code:
/// `#[test]`, `#[tokio::test]`, `#[cfg(test)]`, `#[cfg(all(test, ...))]`.
fn is_test_attribute(t: &[Token], open: usize, close: usize) -> bool {
    let inner = &t[open + 1..close];
    let words: Vec<&str> = inner
        .iter()
        .filter(|x| x.is_ident())
        .map(|x| x.text.as_str())
        .collect();
    let last_path_word = inner
        .iter()
        .take_while(|x| !x.is("("))
        .filter(|x| x.is_ident())
        .last();
    if last_path_word.is_some_and(|w| w.is("test")) {
        return true;
    }
    words.first() == Some(&"cfg") && words.contains(&"test") && !words.contains(&"not")
}

/// The last token of the item (or field, variant, argument) starting at `i`: its body's
/// closing brace, its `;` or `,`, or the token before the brace that closes what holds it.
fn item_end(t: &[Token], mut i: usize) -> usize {
    let mut depth = 0i32;
    while i < t.len() {
        match t[i].text.as_str() {
            "(" | "[" => depth += 1,
            ")" | "]" => depth -= 1,
            "{" if depth <= 0 => return matching(t, i),
            ";" | "," if depth <= 0 => return i,
            "}" if depth <= 0 => return i - 1,
            _ => {}
        }
        i += 1;
    }
    t.len() - 1
}

/// Where the code of a file is test-only: `(first, last)` token ranges of items under a test
/// attribute, in order; and whether the whole file is (`#![cfg(test)]`).
fn test_ranges(t: &[Token]) -> (Vec<(usize, usize)>, bool) {
    let mut ranges = Vec::new();
    let mut i = 0;
    while i + 1 < t.len() {
        let inner = t[i].is("#") && t[i + 1].is("!") && t.get(i + 2).is_some_and(|x| x.is("["));
        if inner {
            let close = matching(t, i + 2);
            if is_test_attribute(t, i + 2, close) {
                return (vec![(0, t.len() - 1)], true);
            }
            i = close + 1;
        } else if t[i].is("#") && t[i + 1].is("[") {
            let close = matching(t, i + 1);
            if is_test_attribute(t, i + 1, close) {
                let end = item_end(t, close + 1);
                ranges.push((i, end));
                i = end + 1;
            } else {
                i = close + 1;
            }
        } else {
            i += 1;
        }
    }
    (ranges, false)
}

/// The tokens of a file with its test-only items removed.
fn non_test_tokens(src: &str) -> Vec<Token> {
    let t = tokens(src);
    let (ranges, whole) = test_ranges(&t);
    if whole {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(t.len());
    let mut next = ranges.iter().peekable();
    let mut i = 0;
    while i < t.len() {
        if let Some(&&(from, to)) = next.peek() {
            if i == from {
                i = to + 1;
                next.next();
                continue;
            }
        }
        out.push(t[i].clone());
        i += 1;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Functions
// ---------------------------------------------------------------------------------------------

/// A function with a body: its name and its first and last lines.
#[derive(Debug, Clone, PartialEq)]
struct Function {
    name: String,
    first: usize,
    last: usize,
}

impl Function {
    fn lines(&self) -> usize {
        self.last - self.first + 1
    }
}

/// Every function with a body outside test-only code, nested ones too (`fn(..)` types and
/// bodiless trait methods are not functions here).
fn functions(src: &str) -> Vec<Function> {
    let t = non_test_tokens(src);
    let mut out = Vec::new();
    for i in 0..t.len() {
        let named = t[i].is("fn") && t.get(i + 1).is_some_and(|n| n.is_ident());
        if !named {
            continue;
        }
        let open = body_or_semicolon(&t, i + 2);
        if t[open].is("{") {
            out.push(Function {
                name: t[i + 1].text.clone(),
                first: t[i].line,
                last: t[matching(&t, open)].line,
            });
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Module graphs
// ---------------------------------------------------------------------------------------------

/// The leaf names of a `use` tree between `from` and `to`: each name followed by `,`, `}` or
/// `;` (an alias after `as` included), `self` left out.
fn use_leaves(t: &[Token], from: usize, to: usize) -> Vec<String> {
    (from..to)
        .filter(|&i| t[i].is_ident() && !t[i].is("self"))
        .filter(|&i| {
            t.get(i + 1)
                .is_some_and(|n| n.is(",") || n.is("}") || n.is(";"))
        })
        .map(|i| t[i].text.clone())
        .collect()
}

/// What a crate root declares: its modules, and the names it imports from them (`use x::Name`
/// makes `crate::Name` a path into `x`).
#[derive(Debug, Default)]
struct Root {
    modules: BTreeSet<String>,
    imported: BTreeMap<String, String>,
    /// Items the root file itself defines (not a module's, re-exported): a module that uses
    /// one depends on the root, which declares (depends on) every module.
    defined: BTreeSet<String>,
}

/// The root file's node in a module graph.
const ROOT_NODE: &str = "(crate root)";

fn read_root(src: &str) -> Root {
    let t = non_test_tokens(src);
    let mut root = Root::default();
    let mut depth = 0;
    for i in 0..t.len() {
        match t[i].text.as_str() {
            "{" => depth += 1,
            "}" => depth -= 1,
            "mod" if depth == 0 => {
                if let Some(name) = t.get(i + 1).filter(|n| n.is_ident()) {
                    root.modules.insert(name.text.clone());
                }
            }
            "fn" | "struct" | "enum" | "const" | "static" | "type" | "trait" | "union"
                if depth == 0 =>
            {
                if let Some(name) = t.get(i + 1).filter(|n| n.is_ident()) {
                    root.defined.insert(name.text.clone());
                }
            }
            _ => {}
        }
    }
    // Imports need the module list: a second pass.
    for i in 0..t.len() {
        let Some(first) = t.get(i + 1) else { break };
        if !(t[i].is("use") && root.modules.contains(&first.text)) {
            continue;
        }
        let end = (i..t.len()).find(|&j| t[j].is(";")).unwrap_or(t.len() - 1);
        for leaf in use_leaves(&t, i + 2, end + 1) {
            root.imported.entry(leaf).or_insert(first.text.clone());
        }
    }
    root
}

/// The module path of a file below `src/` (`a/b.rs` and `a/b/mod.rs` are `[a, b]`).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        if last != "mod.rs" {
            parts.push(last.trim_end_matches(".rs").to_string());
        }
    }
    parts
}

/// The first names after `::` at `i` (the `::` itself at `i`, `i + 1`): one name, or each
/// element's first name of a `{...}` group.
fn names_after(t: &[Token], i: usize) -> Vec<(String, usize)> {
    let Some(next) = t.get(i + 2) else {
        return Vec::new();
    };
    if next.is_ident() {
        return vec![(next.text.clone(), next.line)];
    }
    if !next.is("{") {
        return Vec::new();
    }
    let close = matching(t, i + 2);
    let mut out = Vec::new();
    let mut depth = 0;
    for j in i + 2..close {
        match t[j].text.as_str() {
            "{" => depth += 1,
            "}" => depth -= 1,
            _ => {}
        }
        let starts_element = (t[j].is("{") || t[j].is(",")) && depth == 1;
        if starts_element {
            if let Some(name) = t.get(j + 1).filter(|n| n.is_ident() && !n.is("self")) {
                out.push((name.text.clone(), name.line));
            }
        }
    }
    out
}

/// A reference from one top-level module to another: the target and the line.
type Reference = (String, usize);

/// The top-level modules (or root imports) that a file at `path` (its module path) refers to.
fn references(src: &str, path: &[String]) -> Vec<Reference> {
    let t = non_test_tokens(src);
    // Inline modules: the module path at each token.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut out = Vec::new();
    for i in 0..t.len() {
        while inline.last().is_some_and(|(_, close)| *close < i) {
            inline.pop();
        }
        let path_sep = |j: usize| {
            t.get(j).is_some_and(|x| x.is(":")) && t.get(j + 1).is_some_and(|x| x.is(":"))
        };
        if t[i].is("mod")
            && t.get(i + 1).is_some_and(|n| n.is_ident())
            && t.get(i + 2).is_some_and(|x| x.is("{"))
        {
            inline.push((t[i + 1].text.clone(), matching(&t, i + 2)));
        } else if t[i].is("crate") && path_sep(i + 1) && !(i > 0 && t[i - 1].is("$")) {
            out.extend(names_after(&t, i + 1));
        } else if t[i].is("super")
            && path_sep(i + 1)
            && !(i > 2 && t[i - 1].is(":") && t[i - 3].is("super"))
        {
            // A chain `super::super::x`: climb once per `super`.
            let mut ups = 1;
            let mut j = i + 1;
            while path_sep(j) && t.get(j + 2).is_some_and(|x| x.is("super")) {
                ups += 1;
                j += 3;
            }
            let depth = path.len() + inline.len();
            if ups >= depth && path_sep(j) {
                out.extend(names_after(&t, j));
            }
        }
    }
    out
}

/// One crate's module graph: module → (module it refers to → where, as `file:line`).
type Graph = BTreeMap<String, BTreeMap<String, String>>;

fn module_graph(krate: &Path) -> Graph {
    let src = krate.join("src");
    let mut graph = Graph::new();
    for root_file in ["lib.rs", "main.rs"] {
        let Ok(text) = std::fs::read_to_string(src.join(root_file)) else {
            continue;
        };
        let root = read_root(&text);
        let files = rust_files(&src);
        let tests = test_only_files(&files);
        for file in files.iter().filter(|f| !tests.contains(*f)) {
            let rel = file.strip_prefix(&src).unwrap();
            let path = module_path(rel);
            let Some(module) = path.first().filter(|m| root.modules.contains(*m)) else {
                continue;
            };
            let text = std::fs::read_to_string(file).unwrap();
            for (name, line) in references(&text, &path) {
                let target = if root.modules.contains(&name) {
                    name
                } else if let Some(m) = root.imported.get(&name) {
                    m.clone()
                } else if root.defined.contains(&name) {
                    // The root declares the module: using an item of the root's own is a
                    // cycle through it.
                    graph
                        .entry(ROOT_NODE.to_string())
                        .or_default()
                        .entry(module.clone())
                        .or_insert_with(|| format!("{}/{root_file} (mod {module})", shown(&src)));
                    ROOT_NODE.to_string()
                } else {
                    continue;
                };
                if &target != module {
                    graph
                        .entry(module.clone())
                        .or_default()
                        .entry(target)
                        .or_insert_with(|| format!("{}:{line}", shown(file)));
                }
            }
        }
    }
    graph
}

/// The strongly connected sets of more than one module: the modules that reach `m` and that
/// `m` reaches (the graphs are a few dozen nodes; reachability both ways is enough).
fn cycles(graph: &Graph) -> Vec<BTreeSet<String>> {
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = VecDeque::from([from.to_string()]);
        while let Some(m) = todo.pop_front() {
            for next in graph.get(&m).into_iter().flat_map(|e| e.keys()) {
                if seen.insert(next.clone()) {
                    todo.push_back(next.clone());
                }
            }
        }
        seen
    };
    let mut sets: Vec<BTreeSet<String>> = Vec::new();
    for m in graph.keys() {
        if sets.iter().any(|s| s.contains(m)) {
            continue;
        }
        let from_m = reach(m);
        if !from_m.contains(m) {
            continue;
        }
        let set: BTreeSet<String> = from_m
            .iter()
            .filter(|other| reach(other).contains(m))
            .cloned()
            .collect();
        sets.push(set);
    }
    sets
}

/// A shortest cycle through the first module of `set`, each edge with where it is made.
fn describe_cycle(graph: &Graph, set: &BTreeSet<String>) -> String {
    let start = set.iter().next().unwrap().clone();
    let mut prev: BTreeMap<String, String> = BTreeMap::new();
    let mut todo = VecDeque::from([start.clone()]);
    'search: while let Some(m) = todo.pop_front() {
        for next in graph.get(&m).into_iter().flat_map(|e| e.keys()) {
            if !set.contains(next) || prev.contains_key(next) {
                continue;
            }
            prev.insert(next.clone(), m.clone());
            if *next == start {
                break 'search;
            }
            todo.push_back(next.clone());
        }
    }
    let mut path = vec![start.clone()];
    let mut at = prev.get(&start).cloned();
    while let Some(m) = at {
        path.push(m.clone());
        if m == start {
            break;
        }
        at = prev.get(&m).cloned();
    }
    path.reverse();
    let edges: Vec<String> = path
        .windows(2)
        .map(|w| format!("{} -> {} ({})", w[0], w[1], graph[&w[0]][&w[1]]))
        .collect();
    format!("{} [{}]", path.join(" -> "), edges.join(", "))
}

/// Every edge between members of `set`, with where it is made.
fn edges_within(graph: &Graph, set: &BTreeSet<String>) -> String {
    let mut out = Vec::new();
    for from in set {
        for (to, at) in graph.get(from).into_iter().flatten() {
            if set.contains(to) {
                out.push(format!("{from} -> {to} ({at})"));
            }
        }
    }
    out.join(", ")
}

// ---------------------------------------------------------------------------------------------
// The workspace
// ---------------------------------------------------------------------------------------------

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A path as shown in messages and allow-lists: relative to the workspace.
fn shown(path: &Path) -> String {
    let root = workspace().canonicalize().unwrap();
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    path.strip_prefix(&root)
        .unwrap_or(&path)
        .display()
        .to_string()
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries {
            let p = entry.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn crates() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(workspace().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    out.sort();
    assert!(out.len() > 10, "workspace crates not found: {out:?}");
    out
}

/// Files that only tests compile: those a `#[cfg(test)] mod x;` declares.
fn test_only_files(src_files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for file in src_files {
        let text = std::fs::read_to_string(file).unwrap();
        let t = tokens(&text);
        let (ranges, _) = test_ranges(&t);
        let dir = match file.file_name().and_then(|n| n.to_str()) {
            Some("lib.rs" | "main.rs" | "mod.rs") => file.parent().unwrap().to_path_buf(),
            _ => file.with_extension(""),
        };
        for (from, to) in ranges {
            let decl = &t[from..=to];
            let Some(m) = decl.iter().position(|x| x.is("mod")) else {
                continue;
            };
            if decl.last().is_some_and(|x| x.is(";")) {
                let name = &decl[m + 1].text;
                out.insert(dir.join(format!("{name}.rs")));
                out.insert(dir.join(name).join("mod.rs"));
            }
        }
    }
    out
}

/// Every `src/` file of every crate that is not test-only.
fn source_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for krate in crates() {
        let files = rust_files(&krate.join("src"));
        let tests = test_only_files(&files);
        out.extend(files.into_iter().filter(|f| !tests.contains(f)));
    }
    out
}

/// Fails naming every offender.
fn judge(what: &str, offenders: &BTreeMap<String, String>) {
    assert!(
        offenders.is_empty(),
        "{what}:\n  {}",
        offenders
            .values()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n  ")
    );
}

// ---------------------------------------------------------------------------------------------
// The checks
// ---------------------------------------------------------------------------------------------

#[test]
fn no_native_runtime_file_over_the_limit() {
    let dir = workspace().join("crates/smithers-runtime-native/src");
    let mut offenders = BTreeMap::new();
    let files = rust_files(&dir);
    assert!(!files.is_empty(), "{} not found", dir.display());
    for file in files {
        let lines = std::fs::read_to_string(&file).unwrap().lines().count();
        if lines > MAX_NATIVE_FILE_LINES {
            let key = shown(&file);
            let message = format!(
                "{key}: {lines} lines, over the limit of {MAX_NATIVE_FILE_LINES} for smithers-runtime-native/src"
            );
            offenders.insert(key, message);
        }
    }
    judge(
        &format!("files over {MAX_NATIVE_FILE_LINES} lines"),
        &offenders,
    );
}

#[test]
fn no_function_over_the_limit() {
    let mut offenders = BTreeMap::new();
    let mut seen = 0;
    for file in source_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for f in functions(&text) {
            seen += 1;
            if f.lines() > MAX_FN_LINES {
                let key = format!("{}::{}", shown(&file), f.name);
                let message = format!(
                    "{}:{} fn {}: {} lines, over the limit of {MAX_FN_LINES}",
                    shown(&file),
                    f.first,
                    f.name,
                    f.lines()
                );
                offenders
                    .entry(key)
                    .and_modify(|m: &mut String| {
                        m.push_str("; ");
                        m.push_str(&message);
                    })
                    .or_insert(message);
            }
        }
    }
    assert!(
        seen > 1000,
        "only {seen} functions found: sources not read?"
    );
    judge(&format!("functions over {MAX_FN_LINES} lines"), &offenders);
}

#[test]
fn no_module_cycle_in_a_crate() {
    let mut offenders = BTreeMap::new();
    let mut edges = 0;
    for krate in crates() {
        let name = krate.file_name().unwrap().to_string_lossy().into_owned();
        let graph = module_graph(&krate);
        edges += graph.values().map(BTreeMap::len).sum::<usize>();
        for set in cycles(&graph) {
            let members: Vec<&str> = set.iter().map(String::as_str).collect();
            let key = format!("{name}: {{{}}}", members.join(", "));
            let message = format!(
                "{key}: these modules reach each other, e.g. the cycle {} (the limit: no module may reach itself through others); every edge among them: {}",
                describe_cycle(&graph, &set),
                edges_within(&graph, &set)
            );
            offenders.insert(key, message);
        }
    }
    assert!(
        edges > 20,
        "only {edges} module edges found: sources not read?"
    );
    judge("module cycles", &offenders);
}

// ---------------------------------------------------------------------------------------------
// The reader itself
// ---------------------------------------------------------------------------------------------

#[test]
fn braces_in_strings_chars_and_comments_do_not_count() {
    let src = r####"
fn a() {
    let s = "}}}";
    let r = r#"}"#;
    let c = '}';
    let e = '\'';
    let b = b'{';
    // }
    /* } /* nested } */ } */
    let l: &'static str = "x";
}
fn b() {}
"####;
    let f = functions(src);
    assert_eq!(
        f,
        vec![
            Function {
                name: "a".into(),
                first: 2,
                last: 11
            },
            Function {
                name: "b".into(),
                first: 12,
                last: 12
            },
        ]
    );
}

#[test]
fn test_code_is_left_out() {
    let src = r#"
fn kept() {}
#[cfg(test)]
mod tests {
    fn long_test_helper() {}
}
#[test]
fn a_test() {}
#[tokio::test(flavor = "multi_thread")]
async fn an_async_test() {}
#[cfg(not(test))]
fn not_a_test() {}
trait T { fn bodiless(&self); fn provided(&self) {} }
type F = fn(u8) -> u8;
struct S {
    #[cfg(test)]
    only_in_tests: u8
}
impl S { fn after_a_test_field(&self) {} }
"#;
    let names: Vec<String> = functions(src).into_iter().map(|f| f.name).collect();
    assert_eq!(
        names,
        ["kept", "not_a_test", "provided", "after_a_test_field"]
    );
}

#[test]
fn module_edges_come_from_crate_and_super_paths() {
    let root = read_root(
        "mod a;\npub mod b;\n#[cfg(test)]\nmod t;\npub use b::{Thing, other::Deep as Alias};\n",
    );
    assert_eq!(
        root.modules.iter().collect::<Vec<_>>(),
        ["a", "b"],
        "{root:?}"
    );
    assert_eq!(root.imported["Thing"], "b");
    assert_eq!(root.imported["Alias"], "b");
    let src = "use crate::b::X;\nuse crate::{c, d::Y};\nfn f() { super::e::g(); crate::Thing::new(); }\n\
               macro_rules! m { () => { $crate::z::Q } }\n#[cfg(test)]\nmod tests { use crate::t::U; }\n";
    let refs: Vec<String> = references(src, &["a".to_string()])
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(refs, ["b", "c", "d", "e", "Thing"]);
    // Deeper down, `super::` stays inside the module; `super::super::` climbs out.
    let deep: Vec<String> = references(
        "use super::x::Y;\nuse super::super::e::Z;\n",
        &["a".to_string(), "inner".to_string()],
    )
    .into_iter()
    .map(|(n, _)| n)
    .collect();
    assert_eq!(deep, ["e"]);
}

#[test]
fn cycles_are_found_and_named() {
    let mut graph = Graph::new();
    let mut edge = |a: &str, b: &str| {
        graph
            .entry(a.to_string())
            .or_default()
            .insert(b.to_string(), format!("{a}.rs:1"));
    };
    edge("a", "b");
    edge("b", "c");
    edge("c", "a");
    edge("c", "d");
    edge("d", "e");
    let found = cycles(&graph);
    assert_eq!(found.len(), 1);
    let set = &found[0];
    assert_eq!(set.iter().collect::<Vec<_>>(), ["a", "b", "c"]);
    assert_eq!(
        describe_cycle(&graph, set),
        "a -> b -> c -> a [a -> b (a.rs:1), b -> c (b.rs:1), c -> a (c.rs:1)]"
    );
}
