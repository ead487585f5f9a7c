//! No function of the product's code runs over 80 lines (a test module's are left
//! out): a longer one is split along its meaning, one function per rule or step, so
//! each can be read and tested on its own.

use super::support::{repo, rust_files};

/// The most lines a function may take, its signature and closing brace included.
const MAX_LINES: usize = 80;

/// The text with comments, string and character literals blanked (newlines kept), so
/// a brace inside them cannot count.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && matches!(next, Some('"') | Some('#'))
            && !chars
                .get(i.wrapping_sub(1))
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match chars.get(j) {
                    None => break,
                    Some('"') if (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    _ => j += 1,
                }
            }
            out.extend(chars[i..j.min(chars.len())].iter().map(|c| blank(*c)));
            i = j;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' {
            // A character literal ('{', '\n', '\u{7b}'); a lifetime ('a) has no closing quote.
            let end = if next == Some('\\') {
                (i + 2..chars.len().min(i + 12)).find(|&j| chars[j] == '\'')
            } else {
                (chars.get(i + 2) == Some(&'\'')).then_some(i + 2)
            };
            match end {
                Some(e) => {
                    out.extend(std::iter::repeat_n(' ', e - i + 1));
                    i = e + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The name of the function a line declares, if it declares one.
fn declared(line: &str) -> Option<String> {
    let mut words = line.split_whitespace().peekable();
    while let Some(w) = words.next() {
        let qualifier = w == "pub"
            || w.starts_with("pub(")
            || matches!(
                w,
                "const" | "unsafe" | "async" | "extern" | "\"C\"" | "default"
            );
        if w == "fn" {
            let name: String = words
                .next()?
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            return (!name.is_empty()).then_some(name);
        }
        if !qualifier {
            return None;
        }
    }
    None
}

/// Whether the function declared on line `start` is a `#[test]` (in a file that is a
/// test module of its own, such as a fuzz target's).
fn is_test(text: &str, start: usize) -> bool {
    text.lines()
        .take(start)
        .collect::<Vec<_>>()
        .iter()
        .rev()
        .map(|l| l.trim())
        .take_while(|l| l.starts_with("#[") || l.starts_with("//"))
        .any(|l| l == "#[test]")
}

/// (lines, name, first line) of every function over `MAX_LINES` in `text`, up to its
/// test module.
fn long_functions(text: &str) -> Vec<(usize, String, usize)> {
    let code = code_only(text);
    let lines: Vec<&str> = code.lines().collect();
    let end = text
        .lines()
        .position(|l| l.trim() == "#[cfg(test)]")
        .filter(|&i| text.lines().nth(i + 1).is_some_and(|l| l.contains("mod ")))
        .unwrap_or(lines.len());
    let mut out = Vec::new();
    for (start, line) in lines.iter().enumerate().take(end) {
        let Some(name) = declared(line) else {
            continue;
        };
        if is_test(text, start) {
            continue;
        }
        let mut depth = 0i32;
        let mut opened = false;
        let mut last = None;
        'scan: for (n, l) in lines.iter().enumerate().skip(start) {
            for ch in l.chars() {
                match ch {
                    ';' if !opened => break 'scan,
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => {
                        depth -= 1;
                        if opened && depth == 0 {
                            last = Some(n);
                            break 'scan;
                        }
                    }
                    _ => {}
                }
            }
        }
        if let Some(last) = last
            && last - start + 1 > MAX_LINES
        {
            out.push((last - start + 1, name, start + 1));
        }
    }
    out
}

#[test]
fn no_function_runs_over_80_lines() {
    let src = repo().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut long = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, name, line) in long_functions(&text) {
            let rel = file.strip_prefix(&src).unwrap().display().to_string();
            long.push(format!("src/{rel}:{line}: {name} is {n} lines"));
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn a_long_function_is_caught_and_braces_in_literals_do_not_count() {
    let body = |n: usize| "    let x = 1;\n".repeat(n);
    let text = format!(
        "pub(crate) fn short() {{\n    let s = \"}}}}\"; let c = '}}'; let r = r#\"{{\"#; // }}\n}}\n\
         /* fn hidden() {{ */\n\
         pub async fn long<'a>(x: &'a str) -> Result<(), String> {{\n{}    Ok(())\n}}\n\
         fn exactly() {{\n{}}}\n\
         fn declared_only();\n\
         /// A test outside a test module.\n#[test]\nfn long_test_fn() {{\n{}}}\n\
         #[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{}    }}\n}}\n",
        body(78),
        body(78),
        body(100),
        body(100)
    );
    assert_eq!(long_functions(&text), vec![(81, "long".to_string(), 5)]);
}
