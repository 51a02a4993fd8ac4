//! Finds where a key path is in YAML text, so validation errors (found after parsing, when
//! serde's positions are gone) can still name a line and column. The YAML is read again by
//! serde_yaml_ng, following the path down its mappings and sequences, and refused at the node the
//! path names: the parser puts its own mark on that refusal. A path that goes further than the
//! document is located at the deepest node it reached.

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;
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

/// 1-based line and column of `path` in `text`, or of the deepest part of it that is there.
pub(super) fn locate(text: &str, path: &[Seg]) -> Option<(usize, usize)> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let err = Seek(path).deserialize(de).err()?;
    // (Its text carries the path before the message.)
    let here = err.to_string().contains(HERE);
    let at = err.location()?;
    here.then(|| super::load::line_and_column(text, at.index()))
}

/// The refusal's message, which tells it from the parser's own errors.
const HERE: &str = "inferscope-locate";

/// A visitor's answer to every scalar (and null): refused where it is.
macro_rules! refuse_scalars {
    () => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
            Err(E::custom(HERE))
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
            Err(E::custom(HERE))
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
            Err(E::custom(HERE))
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
            Err(E::custom(HERE))
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
            Err(E::custom(HERE))
        }
        fn visit_unit<E: de::Error>(self) -> Result<(), E> {
            Err(E::custom(HERE))
        }
    };
}

/// Follows the rest of the path from the node it is given.
struct Seek<'p>(&'p [Seg]);

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        match self.0.first() {
            // Refused inside the node's own read, so the parser marks the node.
            None => d.deserialize_any(Refuse),
            // Any node: one that is not a mapping or a sequence ends the path where it is.
            Some(_) => d.deserialize_any(self),
        }
    }
}

impl<'de> Visitor<'de> for Seek<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the path")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (Some(Seg::Key(want)), rest) = (self.0.first(), &self.0[1..]) else {
            return Err(de::Error::custom(HERE));
        };
        // The last key is refused at the key itself: `name:` is where a reader looks.
        let probe = KeyProbe {
            want,
            last: rest.is_empty(),
        };
        while let Some(found) = map.next_key_seed(probe)? {
            if found {
                return map.next_value_seed(Seek(rest));
            }
            map.next_value::<IgnoredAny>()?;
        }
        // Not there: the mapping that should hold it.
        Err(de::Error::custom(HERE))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let (Some(Seg::Index(want)), rest) = (self.0.first(), &self.0[1..]) else {
            return Err(de::Error::custom(HERE));
        };
        for _ in 0..*want {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Err(de::Error::custom(HERE));
            }
        }
        match seq.next_element_seed(Seek(rest))? {
            Some(()) => Ok(()),
            None => Err(de::Error::custom(HERE)),
        }
    }

    refuse_scalars!();
}

/// Reads a mapping key: whether it is the one wanted, refused where it is when it is the path's
/// last step.
#[derive(Clone, Copy)]
struct KeyProbe<'p> {
    want: &'p str,
    last: bool,
}

impl<'de> DeserializeSeed<'de> for KeyProbe<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeyProbe<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        match key == self.want {
            true if self.last => Err(E::custom(HERE)),
            matched => Ok(matched),
        }
    }

    // Keys that are not strings (numbers, booleans, null, collections) are never a config key.
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<bool, A::Error> {
        while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut q: A) -> Result<bool, A::Error> {
        while q.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }
}

/// Refuses whatever node it is given.
struct Refuse;

impl<'de> Visitor<'de> for Refuse {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any node")
    }

    refuse_scalars!();

    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(HERE))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(HERE))
    }
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
    fn finds_block_flow_and_nested_keys_by_the_parser_marks() {
        // Line and column of the key the path ends in, or of the item.
        assert_eq!(locate(Y, &[K("listen")]), Some((1, 1)));
        assert_eq!(locate(Y, &[K("backends"), I(0), K("url")]), Some((3, 16)));
        assert_eq!(locate(Y, &[K("backends"), I(1), K("url")]), Some((5, 5)));
        assert_eq!(
            locate(Y, &[K("routes"), I(0), K("match"), K("model")]),
            Some((8, 14))
        );
        assert_eq!(
            locate(Y, &[K("routes"), I(0), K("backends"), I(1)]),
            Some((9, 19))
        );
        assert_eq!(locate(Y, &[K("routes"), I(1), K("name")]), Some((10, 5)));
        let deep = [
            K("routes"),
            I(1),
            K("experiment"),
            K("variants"),
            I(1),
            K("backends"),
            I(1),
        ];
        assert_eq!(locate(Y, &deep), Some((18, 15)));
        assert_eq!(
            render(&deep),
            "routes[1].experiment.variants[1].backends[1]"
        );
    }

    #[test]
    fn a_path_past_the_document_is_located_at_the_deepest_node_there() {
        // No `retry` in the first route: its mapping.
        assert_eq!(
            locate(Y, &[K("routes"), I(0), K("retry"), K("attempts")]),
            Some((7, 5))
        );
        // No third backend: the sequence.
        assert_eq!(locate(Y, &[K("backends"), I(2)]), Some((3, 3)));
        // Below a scalar: the scalar.
        assert_eq!(locate(Y, &[K("listen"), K("port")]), Some((1, 9)));
        // A root that is not a mapping: the root.
        assert_eq!(locate("- a\n", &[K("a")]), Some((1, 1)));
    }
}
