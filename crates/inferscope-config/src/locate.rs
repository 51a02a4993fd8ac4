//! Finds the line of a key path in YAML text, so validation errors (found after parsing, when
//! serde's positions are gone) can still name a line. Understands block mappings and sequences and
//! keys inside one-line flow mappings (`- { name: a, url: … }`), which is how configs are written;
//! for anything else it falls back to the nearest enclosing key it found.

/// One step of a key path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seg {
    /// A mapping key.
    Key(&'static str),
    /// A sequence index.
    Index(usize),
}

/// `routes[0].backends[1]`.
pub(super) fn render(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn is_content(line: &str) -> bool {
    let t = line.trim();
    !t.is_empty() && !t.starts_with('#')
}

/// The key's column if `line` holds `key:` as a block key (after any `- `), or inside a flow map.
fn key_at(line: &str, key: &str) -> Option<usize> {
    let mut col = indent(line);
    let mut rest = &line[col..];
    while let Some(r) = rest.strip_prefix("- ") {
        col += 2 + (r.len() - r.trim_start().len());
        rest = r.trim_start();
    }
    let pat = format!("{key}:");
    if rest.starts_with(&pat) {
        return Some(col);
    }
    if rest.contains('{') {
        for sep in ["{", ","] {
            for (i, _) in rest.match_indices(sep) {
                if rest[i + sep.len()..].trim_start().starts_with(&pat) {
                    return Some(col + 1);
                }
            }
        }
    }
    None
}

/// 1-based line of `path` in `text`, or of the deepest part of it that could be found.
pub(super) fn locate(text: &str, path: &[Seg]) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let mut from = 0;
    let mut parent: Option<usize> = None; // indent that children must exceed
    let mut found = None;
    for seg in path {
        match *seg {
            Seg::Key(k) => {
                let mut hit = None;
                for (i, line) in lines.iter().enumerate().skip(from) {
                    if !is_content(line) {
                        continue;
                    }
                    if i > from && parent.is_some_and(|p| indent(line) <= p) {
                        break;
                    }
                    if let Some(col) = key_at(line, k) {
                        if parent.is_none_or(|p| col > p) {
                            hit = Some((i, col));
                            break;
                        }
                    }
                }
                let Some((i, col)) = hit else { return found };
                found = Some(i + 1);
                from = i;
                parent = Some(col);
            }
            Seg::Index(n) => {
                let Some(key_line) = lines.get(from) else {
                    return found;
                };
                if key_line.contains('[') {
                    continue; // flow sequence on the key's own line
                }
                let mut item_indent = None;
                let mut count = 0;
                let mut hit = None;
                for (i, line) in lines.iter().enumerate().skip(from + 1) {
                    if !is_content(line) {
                        continue;
                    }
                    let ind = indent(line);
                    let is_item = line.trim_start().starts_with('-');
                    match item_indent {
                        None if is_item => item_indent = Some(ind),
                        None => break,
                        Some(ii) if ind < ii || (ind == ii && !is_item) => break,
                        _ => {}
                    }
                    if is_item && Some(ind) == item_indent {
                        if count == n {
                            hit = Some((i, ind));
                            break;
                        }
                        count += 1;
                    }
                }
                let Some((i, ind)) = hit else { return found };
                found = Some(i + 1);
                from = i;
                parent = Some(ind);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::Seg::{Index as I, Key as K};
    use super::*;

    const Y: &str = "\
listen: 127.0.0.1:8080
backends:
  - { name: a, url: \"http://127.0.0.1:1\" }
  - name: b
    url: http://127.0.0.1:2
routes:
  - name: chat
    match: { model: m }
    backends: [a, c]
  - name: other
    experiment:
      name: x
      variants:
        - { name: v1, backends: [a], weight: 1 }
        - name: v2
          backends:
            - b
            - zz
          weight: 1
";

    #[test]
    fn finds_block_flow_and_nested_keys() {
        assert_eq!(locate(Y, &[K("listen")]), Some(1));
        assert_eq!(locate(Y, &[K("backends"), I(0), K("url")]), Some(3));
        assert_eq!(locate(Y, &[K("backends"), I(1), K("url")]), Some(5));
        assert_eq!(
            locate(Y, &[K("routes"), I(0), K("match"), K("model")]),
            Some(8)
        );
        assert_eq!(
            locate(Y, &[K("routes"), I(0), K("backends"), I(1)]),
            Some(9)
        );
        assert_eq!(locate(Y, &[K("routes"), I(1), K("name")]), Some(10));
        let deep = [
            K("routes"),
            I(1),
            K("experiment"),
            K("variants"),
            I(1),
            K("backends"),
            I(1),
        ];
        assert_eq!(locate(Y, &deep), Some(18));
        assert_eq!(
            render(&deep),
            "routes[1].experiment.variants[1].backends[1]"
        );
    }
}
