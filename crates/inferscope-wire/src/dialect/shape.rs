//! The fast path for ordinary OpenAI chunks: a stream's content chunks differ from one another
//! only in their text (and, on some servers, in a timestamp or an opaque padding string), so
//! the shape of one chunk that the full classifier read is kept and the next chunks are matched
//! against it byte by byte.
//!
//! A `Shape` is a chunk's bytes cut into literal runs and holes. A hole is a string value whose
//! text the classification reads only for emptiness (`content`, `reasoning_content`,
//! `reasoning`, a completion's `text`), or a string or integer value of a top-level key the
//! classifier ignores (`created`, `system_fingerprint`, `obfuscation`). A chunk matches when
//! every literal run is equal and every hole holds a string (or integer) that the JSON parser
//! accepts. Such a chunk is the learned chunk with other scalar values in the same places: the
//! same JSON structure with the same keys, so the full classifier would say of it what it said
//! of the learned chunk, but for `output`, which is then whether any text hole is non-empty
//! (when learning, the shape checks that this rule reproduces the full classifier's `output`).
//!
//! A hole accepts only what the parser is sure to accept the same way: UTF-8 text without
//! control characters and the simple escapes (`\"` `\\` `\/` `\b` `\f` `\n` `\r` `\t`);
//! anything else (`\u` escapes, invalid UTF-8, a number with a fraction) is a miss and goes to
//! the full classifier. A miss never changes an answer, only its cost. `tests/fuzz.rs` checks
//! the two paths against each other on generated streams and every fixture.
//!
//! The `id` is a hole too (an unescaped string, read as the event's `id`), so a shape learned
//! on one stream matches the chunks of the next: a backend's shapes (`Shapes`: its role chunk,
//! content chunk, finish chunk…) are learned by its first streams and shared by the streams
//! after them, which then read even their first chunks without the full classifier.
//!
//! The counts of a `usage` object (`prompt_tokens`, `completion_tokens`, the cached and
//! reasoning counts of their details) are holes as well, read as the event's usage when they
//! hold a plain unsigned integer, so a stream's closing usage chunk reads through the shape an
//! earlier stream learned. A shape whose usage has a count that is not a hole (a count sent as
//! `7.0`, say) fits one stream only and is not shared.
//!
//! No shape holds a line break: a chunk with CR or LF outside its strings (data sent over
//! several SSE `data` lines) is not learned, and no hole takes one (holes refuse control
//! characters). So a document a shape reads is one line, which lets the SSE scanner hand over a
//! frame that is exactly `data: ` + document + blank line without looking for its line ends
//! (`StreamClassifier::read_line`, `SseScanner::single_line`).
//!
//! Within one stream even the holes other than the text repeat (its id, `created`): once the
//! caller has the stream's `id` and `model`, a stream keeps the last chunk a one-text shape read
//! as its `Template`, and a chunk equal to it but for that text is answered by two comparisons
//! and one string scan (see `Template`).

use super::{openai, Dialect, EngineTimes, FinishReason, Observation, Usage};
use std::borrow::Cow;
use std::sync::Arc;

/// Most holes a shape keeps (a chunk with more is not learned).
const MAX_HOLES: usize = 12;
/// Longest chunk learned, in bytes.
const MAX_SHAPE_LEN: usize = 2048;
/// Learning attempts in a row without a match before the stream stops learning.
const MAX_LEARN_MISSES: u8 = 4;
/// Most shapes a backend shares among its streams.
const MAX_SHARED: usize = 8;
/// Longest integer a hole takes (`created` and the like); longer ones are misses.
const MAX_INT_DIGITS: usize = 18;
/// The data of an OpenAI stream's terminal event.
const DONE: &[u8] = b"[DONE]";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HoleKind {
    /// A string whose emptiness is the event's output.
    Text,
    /// The top-level `id`: a string without escapes, the event's `id`.
    Id,
    /// A string the classifier ignores.
    IgnoredStr,
    /// An integer the classifier ignores.
    IgnoredInt,
    /// A token count of the `usage` object: a plain unsigned integer.
    Count(Count),
}

/// Which count of `Usage` a hole holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Count {
    Input,
    Output,
    CachedInput,
    Reasoning,
}

impl Count {
    fn of(self, u: &mut Usage) -> &mut Option<u64> {
        match self {
            Self::Input => &mut u.input,
            Self::Output => &mut u.output,
            Self::CachedInput => &mut u.cached_input,
            Self::Reasoning => &mut u.reasoning,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Hole {
    /// Byte range of the value in the learned chunk.
    start: u32,
    end: u32,
    kind: HoleKind,
}

const NO_HOLE: Hole = Hole {
    start: 0,
    end: 0,
    kind: HoleKind::IgnoredStr,
};

/// Where the borrowed `model` sits: in literal run `run`, `off` bytes in.
#[derive(Debug, Clone, Copy)]
struct Place {
    run: u8,
    off: u32,
    len: u32,
}

/// What the full classifier said of the learned chunk, but for `id`, `model` and `output`.
#[derive(Debug, Clone, Default)]
struct Said {
    tokens: Option<u32>,
    usage: Option<Usage>,
    usage_only: bool,
    finish: Option<FinishReason>,
    engine: Option<EngineTimes>,
    error: bool,
}

impl Said {
    /// What `o` says, but for `id`, `model` and `output`.
    fn of(o: &Observation<'_>) -> Self {
        Self {
            tokens: o.tokens,
            usage: o.usage,
            usage_only: o.usage_only,
            finish: o.finish.clone(),
            engine: o.engine,
            error: o.error,
        }
    }

    /// The observation of a chunk this was said of, with `output`, without `id` and `model`.
    fn observation<'d>(&self, output: bool) -> Observation<'d> {
        Observation {
            id: None,
            model: None,
            output,
            tokens: self.tokens,
            usage: self.usage,
            usage_only: self.usage_only,
            finish: self.finish.clone(),
            engine: self.engine,
            done: false,
            error: self.error,
            malformed: false,
        }
    }
}

/// Where a shape found things in the chunk it read.
#[derive(Debug, Default, Clone, Copy)]
struct Found {
    /// An id other than the stream's last one.
    id: Option<(usize, usize)>,
    /// The last text hole's value, quotes included.
    text: Option<(usize, usize)>,
}

/// One learned chunk shape.
#[derive(Debug)]
struct Shape {
    doc: Vec<u8>,
    holes: [Hole; MAX_HOLES],
    n_holes: usize,
    model: Option<Place>,
    said: Said,
    /// Fits the chunks of any stream: every count its usage says is a hole.
    shareable: bool,
    /// How many of its holes are text holes.
    texts: u8,
}

/// The shapes a backend's streams share: learned by its first streams, read by all (see the
/// module's notes). Cheap to read: a stream takes the list once, when it starts.
#[derive(Debug, Default)]
pub struct Shapes(arc_swap::ArcSwap<Vec<Arc<Shape>>>);

impl Shapes {
    /// Offers `shape`, learned on `doc`: kept unless the list is full or a shape in it reads
    /// `doc` already. Returns the list as it is now.
    fn offer(&self, shape: &Arc<Shape>, doc: &[u8]) -> Arc<Vec<Arc<Shape>>> {
        self.0.rcu(|list| {
            if list.len() >= MAX_SHARED || list.iter().any(|s| s.reads(doc)) {
                return Arc::clone(list);
            }
            let mut more = Vec::with_capacity(list.len() + 1);
            more.extend(list.iter().cloned());
            more.push(Arc::clone(shape));
            Arc::new(more)
        });
        self.0.load_full()
    }

    /// How many shapes are shared.
    pub fn len(&self) -> usize {
        self.0.load().len()
    }

    /// No shape is shared yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Classifies the events of one stream in `dialect`, through a learned shape where one
/// matches (OpenAI chat and completions), else through the dialect's full classifier. Its
/// answers are the full classifier's, event for event.
#[derive(Debug)]
pub struct StreamClassifier {
    dialect: Dialect,
    /// Where shapes this stream learns are offered to the streams after it.
    shared: Option<Arc<Shapes>>,
    /// The shared shapes as this stream knows them.
    known: Arc<Vec<Arc<Shape>>>,
    /// The shape learned by this stream and not shared (a shape saying usage, or a full list).
    own: Option<Shape>,
    /// Which shape matched last, tried first: `known`'s index, or `known.len()` for `own`.
    last: usize,
    learn_misses: u8,
    hits: u64,
    /// The caller still wants `id` and `model` from chunks read through a shape (each is one
    /// more UTF-8 check per chunk); the full classifier gives them regardless.
    names: bool,
    /// The id of the last chunk a shape read (`id_len` 0: none, or longer than the buffer): a
    /// stream repeats its id in every chunk, and equal bytes need no scan.
    id: [u8; MAX_KEPT_ID],
    id_len: u8,
    /// The stream's last chunk a shape read that varies in one text only (see `Template`).
    template: Template,
}

/// Longest id kept for the comparison (vLLM's and OpenAI's are 38–41 bytes).
const MAX_KEPT_ID: usize = 64;

/// Template misses in a row (each followed by a shape's read, which takes a new template)
/// before the stream stops keeping one: chunks that differ in more than their text (a padding
/// string per chunk) would otherwise pay for a copy each.
const MAX_TEMPLATE_MISSES: u8 = 4;

/// A stream's chunks of one kind differ only in their text: within a stream its id, `created`
/// and `model` are the same in every content chunk. So the last chunk a shape read, when that
/// shape has exactly one text hole, is kept whole (its bytes copied once per change of kind, the
/// buffer reused): a chunk whose bytes before and after that hole are the same, and whose hole
/// holds a string the parser accepts, is that chunk with another text, which the shape reads
/// the same way but for `output`. Two comparisons and one string scan, where the shape checks
/// each literal run and hole in turn.
///
/// Kept only once the caller has the stream's `id` and `model` (the shape then reads neither),
/// so what the template answers is what the shape said, whole.
#[derive(Debug, Default)]
struct Template {
    doc: Vec<u8>,
    /// The text hole's value (quotes included) in `doc`; `end == 0`: no template.
    start: usize,
    end: usize,
    said: Said,
    misses: u8,
}

impl Template {
    /// `output` of `doc` when it is the template with another text.
    fn read(&self, doc: &[u8]) -> Option<bool> {
        if self.end == 0 {
            return None;
        }
        let (head, tail) = (&self.doc[..self.start], &self.doc[self.end..]);
        if doc.len() < head.len() + tail.len() + 2 || !doc.starts_with(head) || !doc.ends_with(tail)
        {
            return None;
        }
        let text = &doc[head.len()..doc.len() - tail.len()];
        // The whole middle is one string: its quotes end where the template's tail begins.
        (string_len(text)? == text.len()).then_some(text.len() > 2)
    }

    /// Keeps `doc`, read by a shape as `o`, whose one text hole is `text`; a chunk longer than
    /// any shape learns is not kept (a held stream would carry its copy), and the template
    /// kept before stays (it is still true).
    fn keep(&mut self, doc: &[u8], text: (usize, usize), o: &Observation<'_>) {
        if doc.len() > MAX_SHAPE_LEN {
            return;
        }
        self.doc.clear();
        self.doc.extend_from_slice(doc);
        (self.start, self.end) = text;
        self.said = Said::of(o);
    }
}

/// What a stream brings to a shape read.
#[derive(Debug, Clone, Copy)]
struct Reader<'a> {
    /// Read `id` and `model`.
    names: bool,
    /// The id of the stream's last chunk, when known.
    last_id: &'a [u8],
}

impl Reader<'_> {
    /// Only whether a shape reads a chunk.
    const CHECK: Reader<'static> = Reader {
        names: false,
        last_id: &[],
    };
}

impl StreamClassifier {
    /// A classifier for one stream of `dialect` events, learning on its own.
    pub fn new(dialect: Dialect) -> Self {
        Self {
            dialect,
            shared: None,
            known: Arc::default(),
            own: None,
            last: 0,
            learn_misses: 0,
            hits: 0,
            names: true,
            id: [0; MAX_KEPT_ID],
            id_len: 0,
            template: Template::default(),
        }
    }

    /// A classifier for one stream of `dialect` events that reads through `shapes` and offers
    /// them what it learns.
    pub fn sharing(dialect: Dialect, shapes: Arc<Shapes>) -> Self {
        Self {
            known: shapes.0.load_full(),
            shared: Some(shapes),
            ..Self::new(dialect)
        }
    }

    /// The dialect it reads.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Stops reading `id` and `model` from chunks a shape answers (the caller has them).
    pub fn names_known(&mut self) {
        self.names = false;
    }

    /// Events answered by the learned shape so far.
    pub fn fast_hits(&self) -> u64 {
        self.hits
    }

    /// What `data` (one event's data) means: equal to `self.dialect().classify(data)`.
    pub fn classify<'d>(&mut self, data: &'d [u8]) -> Observation<'d> {
        let mut o = Observation::default();
        self.classify_into(data, &mut o);
        o
    }

    /// `classify`, written into `o` (whatever it held is replaced): the observation is built
    /// where the caller keeps it, not moved out through the shapes tried.
    pub fn classify_into<'d>(&mut self, data: &'d [u8], o: &mut Observation<'d>) {
        if self.dialect != Dialect::OpenAi {
            *o = self.dialect.classify(data);
            return;
        }
        let doc = data.trim_ascii();
        if doc == DONE {
            *o = Observation::terminal();
            return;
        }
        if self.read(doc, o) {
            self.hits += 1;
            self.learn_misses = 0;
            return;
        }
        *o = openai::classify(data);
        if !o.malformed && !o.done && self.learn_misses < MAX_LEARN_MISSES {
            self.learn_misses += 1;
            self.learn(doc, o);
        }
    }

    /// `classify` of `doc` (an event's whole data, untrimmed) when a learned shape reads it or
    /// it is the terminal `[DONE]`, else `false` and `o` untouched: the full classifier is not
    /// asked. A shape holds no line break, so `doc` holds none when this is `true` (see the
    /// module's notes).
    pub fn read_line<'d>(&mut self, doc: &'d [u8], o: &mut Observation<'d>) -> bool {
        if self.dialect != Dialect::OpenAi {
            return false;
        }
        // No shape reads the terminal event: every one would be tried, and fail, first.
        if doc == DONE {
            *o = Observation::terminal();
            return true;
        }
        if !self.read(doc, o) {
            return false;
        }
        self.hits += 1;
        self.learn_misses = 0;
        true
    }

    /// `doc` through the shape that matched last, then through the ones after it, in the order
    /// they were learned (a stream's chunks come in that order: role, content, finish, usage),
    /// wrapping around; `false` when none reads it (`o` is then untouched).
    fn read<'d>(&mut self, doc: &'d [u8], o: &mut Observation<'d>) -> bool {
        let templating = !self.names && self.template.misses < MAX_TEMPLATE_MISSES;
        if templating {
            if let Some(output) = self.template.read(doc) {
                self.template.misses = 0;
                *o = self.template.said.observation(output);
                return true;
            }
        }
        let n = self.known.len();
        let shape = |i: usize| -> Option<&Shape> {
            match self.known.get(i) {
                Some(s) => Some(s),
                None => self.own.as_ref(),
            }
        };
        let r = Reader {
            names: self.names,
            last_id: &self.id[..usize::from(self.id_len)],
        };
        let mut at = Found::default();
        let Some(i) = (0..=n)
            .map(|k| (self.last + k) % (n + 1))
            .find(|&i| shape(i).is_some_and(|s| s.read(doc, r, &mut at, o).is_some()))
        else {
            return false;
        };
        self.last = i;
        if templating {
            // A template that was there and did not read this chunk.
            if self.template.end != 0 {
                self.template.misses += 1;
            }
            match at.text {
                Some(text) if shape(i).is_some_and(|s| s.texts == 1) => {
                    self.template.keep(doc, text, o);
                }
                _ => {}
            }
        }
        let id_at = at.id;
        // An id other than the last one: kept for the next chunk (when it fits).
        if let Some((start, end)) = id_at {
            let id = &doc[start..end];
            match (self.id.get_mut(..id.len()), u8::try_from(id.len())) {
                (Some(buf), Ok(len)) => {
                    buf.copy_from_slice(id);
                    self.id_len = len;
                }
                _ => self.id_len = 0,
            }
        }
        true
    }

    /// Learns the shape of `doc`, which the full classifier read as `o`: shared when it can be,
    /// else this stream's own. A shape that fails to learn changes nothing.
    fn learn(&mut self, doc: &[u8], o: &Observation<'_>) {
        // A shape to share needs a buffer of its own; one this stream keeps takes over the
        // buffer of the shape it replaces (no allocation once a stream has learned).
        let sharing = self.shared.is_some();
        let own = &mut self.own;
        let recycle = |shareable: bool| match (sharing && shareable, own.take()) {
            (false, Some(old)) => old.doc,
            (_, old) => {
                *own = old;
                Vec::new()
            }
        };
        let Some(shape) = Shape::learn(doc, o, recycle) else {
            return;
        };
        if let Some(shared) = self.shared.as_ref().filter(|_| shape.shareable) {
            let shape = Arc::new(shape);
            self.known = shared.offer(&shape, doc);
            if let Some(i) = self.known.iter().position(|s| s.reads(doc)) {
                self.last = i;
                return;
            }
            // The list is full: this stream keeps it.
            self.own = Arc::try_unwrap(shape).ok();
        } else {
            self.own = Some(shape);
        }
        self.last = self.known.len();
    }
}

impl Shape {
    /// Reads `doc` (trimmed) through this shape into `out`; `None` when it does not match (`out`
    /// is then untouched). `id` and `model` are read only when `r.names`; where in `doc` an id
    /// other than `r.last_id` is, and where its (last) text hole is, go in `at`.
    fn read<'d>(
        &self,
        doc: &'d [u8],
        r: Reader<'_>,
        at_out: &mut Found,
        out: &mut Observation<'d>,
    ) -> Option<()> {
        *at_out = Found::default();
        if self.n_holes == 0 {
            return None;
        }
        let names = r.names;
        let mut at = 0usize; // in `doc`
        let mut from = 0usize; // in `self.doc`
        let mut output = false;
        let mut id = None;
        let mut model = None;
        let mut usage = self.said.usage;
        for (run, hole) in self.holes[..self.n_holes].iter().enumerate() {
            let lit = &self.doc[from..hole.start as usize];
            if doc.get(at..at + lit.len())? != lit {
                return None;
            }
            if names {
                self.place(run, at, doc, &mut model)?;
            }
            at += lit.len();
            let rest = &doc[at..];
            let n = match hole.kind {
                HoleKind::Text => {
                    let n = string_len(rest)?;
                    output |= n > 2;
                    at_out.text = Some((at, at + n));
                    n
                }
                HoleKind::Id => {
                    // The last chunk's id again (it passed the checks below), quoted: the same
                    // length `string_len` would find, as it holds no quote or backslash.
                    let k = r.last_id.len();
                    let n = if k > 0
                        && rest.first() == Some(&b'"')
                        && rest.get(k + 1) == Some(&b'"')
                        && &rest[1..=k] == r.last_id
                    {
                        k + 2
                    } else {
                        let n = string_len(rest)?;
                        if rest[1..n - 1].contains(&b'\\') {
                            return None;
                        }
                        at_out.id = Some((at + 1, at + n - 1));
                        n
                    };
                    if names {
                        // `string_len` checked it is UTF-8.
                        id = Some(Cow::Borrowed(std::str::from_utf8(&rest[1..n - 1]).ok()?));
                    }
                    n
                }
                HoleKind::IgnoredStr => string_len(rest)?,
                HoleKind::IgnoredInt => int_len(rest)?,
                HoleKind::Count(c) => {
                    let (n, v) = count(rest)?;
                    if let Some(u) = usage.as_mut() {
                        *c.of(u) = Some(v);
                    }
                    n
                }
            };
            at += n;
            from = hole.end as usize;
        }
        let tail = &self.doc[from..];
        if &doc[at..] != tail {
            return None;
        }
        if names {
            self.place(self.n_holes, at, doc, &mut model)?;
        }
        let said = &self.said;
        *out = Observation {
            id,
            model,
            output,
            tokens: said.tokens,
            usage,
            usage_only: said.usage_only,
            finish: said.finish.clone(),
            engine: said.engine,
            done: false,
            error: said.error,
            malformed: false,
        };
        Some(())
    }

    /// Whether this shape reads `doc`.
    fn reads(&self, doc: &[u8]) -> bool {
        let mut o = Observation::default();
        self.read(doc, Reader::CHECK, &mut Found::default(), &mut o)
            .is_some()
    }

    /// Sets `model` when it sits in literal run `run`, which starts at `at` in `doc`.
    fn place<'d>(
        &self,
        run: usize,
        at: usize,
        doc: &'d [u8],
        model: &mut Option<Cow<'d, str>>,
    ) -> Option<()> {
        if let Some(p) = self.model.filter(|p| usize::from(p.run) == run) {
            let s = at + p.off as usize;
            // The bytes equal the learned chunk's, which the parser read as UTF-8.
            let text = std::str::from_utf8(&doc[s..s + p.len as usize]).ok()?;
            *model = Some(Cow::Borrowed(text));
        }
        Some(())
    }

    /// The shape of `doc` (trimmed), which the full classifier read as `o`, when it is one
    /// worth matching; its copy of `doc` goes in `buf` (cleared first), so a stream that learns
    /// again reuses its allocation.
    fn learn(doc: &[u8], o: &Observation<'_>, buf: impl FnOnce(bool) -> Vec<u8>) -> Option<Shape> {
        if doc.len() > MAX_SHAPE_LEN
            || matches!(o.finish, Some(FinishReason::Other(_)))
            || memchr::memchr2(b'\r', b'\n', doc).is_some()
        {
            return None;
        }
        let mut w = Walk {
            d: doc,
            p: 0,
            holes: [NO_HOLE; MAX_HOLES],
            n: 0,
            model: None,
        };
        if w.top().is_none() || w.n == 0 {
            return None;
        }
        // The rule `output = a text hole is non-empty` must give the full classifier's answer
        // on the learned chunk itself.
        let text_output = w.holes[..w.n]
            .iter()
            .any(|h| h.kind == HoleKind::Text && h.end - h.start > 2);
        if text_output != o.output {
            return None;
        }
        // Every count hole holds what the full classifier read there; the shape fits any
        // stream when its holes give every count the usage has.
        let mut holed = Usage::default();
        for h in &w.holes[..w.n] {
            if let HoleKind::Count(c) = h.kind {
                let (_, v) = count(&doc[h.start as usize..h.end as usize])?;
                let mut said = o.usage?;
                if *c.of(&mut said) != Some(v) || c.of(&mut holed).replace(v).is_some() {
                    return None;
                }
            }
        }
        let shareable = o.usage.is_none_or(|u| u == holed);
        // Places are absolute offsets until here: make them relative to their literal run.
        let locate = |range: Option<(usize, usize)>| -> Option<Option<Place>> {
            let Some((s, e)) = range else {
                return Some(None);
            };
            let mut run_start = 0usize;
            for (run, h) in w.holes[..w.n].iter().enumerate() {
                if e <= h.start as usize {
                    return (s >= run_start).then_some(Some(Place {
                        run: u8::try_from(run).ok()?,
                        off: u32::try_from(s - run_start).ok()?,
                        len: u32::try_from(e - s).ok()?,
                    }));
                }
                run_start = h.end as usize;
            }
            (s >= run_start).then_some(Some(Place {
                run: u8::try_from(w.n).ok()?,
                off: u32::try_from(s - run_start).ok()?,
                len: u32::try_from(e - s).ok()?,
            }))
        };
        let model = locate(w.model)?;
        // `id` and `model` are borrowed by the full classifier only when unescaped; a hole or
        // a place exists only for an unescaped string, and then both agree.
        let id_hole = w.holes[..w.n].iter().any(|h| h.kind == HoleKind::Id);
        if o.id.is_some() != id_hole || o.model.is_some() != model.is_some() {
            return None;
        }
        let mut copy = buf(shareable);
        copy.clear();
        copy.extend_from_slice(doc);
        Some(Shape {
            doc: copy,
            holes: w.holes,
            n_holes: w.n,
            model,
            said: Said::of(o),
            shareable,
            texts: w.holes[..w.n]
                .iter()
                .filter(|h| h.kind == HoleKind::Text)
                .count() as u8,
        })
    }
}

/// Length of the JSON string at the start of `s` (quotes included), when the parser is sure
/// to accept it: UTF-8, no control characters, only the simple escapes.
fn string_len(s: &[u8]) -> Option<usize> {
    if s.first() != Some(&b'"') {
        return None;
    }
    let mut i = 1;
    let mut ascii = true;
    loop {
        // Eight plain bytes at a time (printable ASCII, neither quote nor backslash), then
        // straight to the first byte that is not: the byte match below takes it.
        while let Some(w) = s.get(i..i + 8) {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            let m = crate::text::not_plain(u64::from_le_bytes(word));
            if m != 0 {
                i += (m.trailing_zeros() / 8) as usize;
                break;
            }
            i += 8;
        }
        let b = *s.get(i)?;
        match b {
            b'"' => break,
            b'\\' => {
                if !matches!(
                    s.get(i + 1)?,
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't'
                ) {
                    return None;
                }
                i += 2;
            }
            0..=0x1f => return None,
            0x80.. => {
                ascii = false;
                i += 1;
            }
            _ => i += 1,
        }
    }
    if !ascii {
        std::str::from_utf8(&s[1..i]).ok()?;
    }
    Some(i + 1)
}

/// Length and value of the plain unsigned integer at the start of `s` (`0|[1-9][0-9]*`, at
/// most 18 digits, so within what the parser reads as a `u64`).
fn count(s: &[u8]) -> Option<(usize, u64)> {
    let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > MAX_INT_DIGITS || (digits > 1 && s[0] == b'0') {
        return None;
    }
    let v = s[..digits]
        .iter()
        .fold(0u64, |v, b| v * 10 + u64::from(b - b'0'));
    Some((digits, v))
}

/// Length of the plain integer at the start of `s` (`-?(0|[1-9][0-9]*)`, at most 18 digits).
/// What follows is not looked at: the next literal run must match it.
fn int_len(s: &[u8]) -> Option<usize> {
    let sign = usize::from(s.first() == Some(&b'-'));
    Some(sign + count(&s[sign..])?.0)
}

/// A walk over a chunk the full classifier accepted, finding its holes (its `id` among them)
/// and the place of its `model`. It declines (returns `None`) on anything outside the shapes it knows:
/// escaped keys, tool calls, content given as parts, both `delta` and `message`, more holes
/// than it keeps.
struct Walk<'a> {
    d: &'a [u8],
    p: usize,
    holes: [Hole; MAX_HOLES],
    n: usize,
    model: Option<(usize, usize)>,
}

impl Walk<'_> {
    fn peek(&self) -> Option<u8> {
        self.d.get(self.p).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.p += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        self.ws();
        (self.peek()? == b).then(|| self.p += 1)
    }

    fn hole(&mut self, start: usize, kind: HoleKind) -> Option<()> {
        let slot = self.holes.get_mut(self.n)?;
        *slot = Hole {
            start: u32::try_from(start).ok()?,
            end: u32::try_from(self.p).ok()?,
            kind,
        };
        self.n += 1;
        Some(())
    }

    /// The range of the raw string at the cursor (quotes included), cursor moved past it.
    fn string(&mut self) -> Option<(usize, usize)> {
        self.ws();
        let start = self.p;
        if self.peek()? != b'"' {
            return None;
        }
        self.p += 1;
        loop {
            match self.peek()? {
                b'"' => break,
                b'\\' => self.p += 2,
                _ => self.p += 1,
            }
        }
        self.p += 1;
        Some((start, self.p))
    }

    /// Skips any value.
    fn skip(&mut self) -> Option<()> {
        self.ws();
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' => self.members(|w, _| w.skip()),
            b'[' => self.elements(Self::skip),
            _ => {
                while !matches!(
                    self.peek()?,
                    b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'
                ) {
                    self.p += 1;
                }
                Some(())
            }
        }
    }

    /// Walks an object, calling `each` with the cursor on every member's value.
    fn members(&mut self, mut each: impl FnMut(&mut Self, &[u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.peek()? == b'}' {
            self.p += 1;
            return Some(());
        }
        loop {
            let (s, e) = self.string()?;
            self.eat(b':')?;
            let d = self.d;
            let key = &d[s + 1..e - 1];
            if key.contains(&b'\\') {
                return None;
            }
            each(self, key)?;
            self.ws();
            match self.peek()? {
                b',' => self.p += 1,
                b'}' => {
                    self.p += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Walks an array, calling `each` with the cursor on every element.
    fn elements(&mut self, mut each: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        self.ws();
        if self.peek()? == b']' {
            self.p += 1;
            return Some(());
        }
        loop {
            each(self)?;
            self.ws();
            match self.peek()? {
                b',' => self.p += 1,
                b']' => {
                    self.p += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// The value at the cursor is `null` (skipped) — true — or something else (not moved).
    fn null(&mut self) -> bool {
        self.ws();
        let is = self.d[self.p..].starts_with(b"null");
        if is {
            self.p += 4;
        }
        is
    }

    /// A text field: a string (a hole) or null.
    fn text(&mut self) -> Option<()> {
        if self.null() {
            return Some(());
        }
        self.ws();
        let start = self.p;
        self.string()?;
        self.hole(start, HoleKind::Text)
    }

    /// The whole chunk: an object.
    fn top(&mut self) -> Option<()> {
        self.members(|w, key| match key {
            b"choices" => {
                if w.null() {
                    return Some(());
                }
                w.elements(Self::choice)
            }
            b"id" | b"model" => {
                if w.null() {
                    return Some(());
                }
                let (s, e) = w.string()?;
                if w.d[s..e].contains(&b'\\') {
                    return None;
                }
                if key == b"id" {
                    w.hole(s, HoleKind::Id)
                } else {
                    w.model = Some((s + 1, e - 1));
                    Some(())
                }
            }
            b"usage" => {
                if w.null() {
                    return Some(());
                }
                w.members(|w, key| match key {
                    b"prompt_tokens" => w.count(Count::Input),
                    b"completion_tokens" => w.count(Count::Output),
                    b"prompt_tokens_details" => w.details(b"cached_tokens", Count::CachedInput),
                    b"completion_tokens_details" => {
                        w.details(b"reasoning_tokens", Count::Reasoning)
                    }
                    _ => w.ignored(),
                })
            }
            b"error" | b"object" | b"timings" => w.skip(),
            _ => w.ignored(),
        })?;
        self.ws();
        (self.p == self.d.len()).then_some(())
    }

    /// A value the classifier ignores: a string or plain integer is a hole, anything else is
    /// skipped (literal).
    fn ignored(&mut self) -> Option<()> {
        self.ws();
        let start = self.p;
        match self.peek()? {
            b'"' => {
                self.string()?;
                self.hole(start, HoleKind::IgnoredStr)
            }
            b'-' | b'0'..=b'9' => {
                self.skip()?;
                match int_len(&self.d[start..self.p]) {
                    Some(n) if n == self.p - start => self.hole(start, HoleKind::IgnoredInt),
                    _ => Some(()),
                }
            }
            _ => self.skip(),
        }
    }

    /// A token count: a hole when a plain unsigned integer, else skipped (literal).
    fn count(&mut self, c: Count) -> Option<()> {
        self.ws();
        let start = self.p;
        self.skip()?;
        match count(&self.d[start..self.p]) {
            Some((n, _)) if n == self.p - start => self.hole(start, HoleKind::Count(c)),
            _ => Some(()),
        }
    }

    /// A details object of `usage`, whose member `name` is count `c` (the others are skipped).
    fn details(&mut self, name: &[u8], c: Count) -> Option<()> {
        if self.null() {
            return Some(());
        }
        self.ws();
        if self.peek()? != b'{' {
            return self.skip();
        }
        self.members(|w, key| if key == name { w.count(c) } else { w.skip() })
    }

    /// One element of `choices`: an object.
    fn choice(&mut self) -> Option<()> {
        let mut message = false;
        self.members(|w, key| match key {
            b"text" => w.text(),
            b"delta" | b"message" => {
                // The classifier reads `delta` before `message`: a choice with both is not
                // learned.
                if std::mem::replace(&mut message, true) {
                    return None;
                }
                if w.null() {
                    return Some(());
                }
                w.members(|w, key| match key {
                    b"content" | b"reasoning_content" | b"reasoning" => w.text(),
                    b"tool_calls" => {
                        if w.null() {
                            return Some(());
                        }
                        w.eat(b'[')?;
                        w.eat(b']')
                    }
                    _ => w.skip(),
                })
            }
            _ => w.skip(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(text: &str) -> Vec<u8> {
        format!("{{\"id\":\"chatcmpl-7\",\"object\":\"chat.completion.chunk\",\"created\":1764500000,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}").into_bytes()
    }

    #[test]
    fn content_chunks_are_read_through_the_shape() {
        let mut c = StreamClassifier::new(Dialect::OpenAi);
        for (i, text) in ["a", " b", "", "caf\u{e9}", "line\\n", "q\\\"", "x"]
            .iter()
            .enumerate()
        {
            let data = chunk(text);
            let fast = c.classify(&data);
            assert_eq!(fast, openai::classify(&data), "{text}");
            assert_eq!(c.fast_hits(), i as u64, "{text}");
        }
    }

    #[test]
    fn a_stream_s_chunks_read_through_its_template_as_through_its_shape() {
        let role = br#"{"id":"chatcmpl-7","object":"chat.completion.chunk","created":1764500000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#;
        let finish = br#"{"id":"chatcmpl-7","object":"chat.completion.chunk","created":1764500000,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}"#;
        let mut c = StreamClassifier::new(Dialect::OpenAi);
        let full = |data: &[u8]| Observation {
            id: None,
            model: None,
            ..openai::classify(data)
        };
        c.classify(role);
        c.names_known();
        c.classify(&chunk("a"));
        assert_eq!(c.classify(&chunk("b")), full(&chunk("b")));
        assert_eq!(
            c.template.end - c.template.start,
            3,
            "the template is the content chunk"
        );
        // From here on only the template reads: no shape is left to.
        c.known = Arc::default();
        c.own = None;
        let hits = c.fast_hits();
        let texts = ["", " b", "caf\u{e9}", "q\\\"", "x\\n", "\\/\\t"];
        for text in texts {
            let data = chunk(text);
            assert_eq!(c.classify(&data), full(&data), "{text}");
        }
        assert_eq!(c.fast_hits() - hits, texts.len() as u64);
        // What the template does not read goes to the parser, with the same answer.
        for data in [
            chunk("\\u00e9"),
            chunk("tab\there"),
            chunk("a\"b"),
            [&chunk("a")[..107], b"\xff\"}}]}"].concat(),
            String::from_utf8_lossy(&chunk("a"))
                .replace("1764500000", "1764500001")
                .into_bytes(),
            finish.to_vec(),
            role.to_vec(),
        ] {
            // The parser gives `id` and `model` whatever the caller knows.
            let got = Observation {
                id: None,
                model: None,
                ..c.classify(&data)
            };
            assert_eq!(got, full(&data), "{}", String::from_utf8_lossy(&data));
        }
    }

    #[test]
    fn chunks_that_differ_in_more_than_their_text_stop_the_template() {
        let padded = |text: &str, pad: &str| {
            format!("{{\"id\":\"x\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}],\"obfuscation\":\"{pad}\"}}").into_bytes()
        };
        let mut c = StreamClassifier::new(Dialect::OpenAi);
        c.classify(&padded("a", "p0"));
        c.names_known();
        for i in 1..=MAX_TEMPLATE_MISSES + 1 {
            let data = padded("b", &format!("p{i}"));
            assert_eq!(c.classify(&data).output, openai::classify(&data).output);
        }
        assert_eq!(c.template.misses, MAX_TEMPLATE_MISSES);
        // Stopped: chunks are read through the shape, with no copy into a template.
        let kept = c.template.doc.clone();
        let data = padded("c", "p9");
        assert!(c.classify(&data).output);
        assert_eq!(c.template.doc, kept);
    }

    #[test]
    fn a_long_chunk_is_read_but_not_kept() {
        let mut c = StreamClassifier::new(Dialect::OpenAi);
        c.classify(&chunk("a"));
        c.names_known();
        c.classify(&chunk("b"));
        c.classify(&chunk("c"));
        let kept = c.template.doc.clone();
        let long = chunk(&"x".repeat(MAX_SHAPE_LEN));
        assert_eq!(c.classify(&long).output, openai::classify(&long).output);
        assert_eq!(c.template.doc, kept);
        assert!(c.template.doc.capacity() <= MAX_SHAPE_LEN);
    }

    #[test]
    fn the_terminal_event_is_answered_without_the_shapes() {
        let mut c = StreamClassifier::new(Dialect::OpenAi);
        c.classify(&chunk("a"));
        let mut o = Observation::default();
        assert!(c.read_line(b"[DONE]", &mut o));
        assert_eq!(o, openai::classify(b"[DONE]"));
        assert!(o.done);
        for data in [&b"[DONE]"[..], b" [DONE]\n", b"[DONE]x", b"[done]"] {
            assert_eq!(c.classify(data), openai::classify(data), "{data:?}");
        }
        // Other text, whatever it resembles, is still the shapes' or the parser's to read.
        let mut o = Observation::default();
        assert!(!c.read_line(b" [DONE]", &mut o));
        assert!(!c.read_line(b"[DONE]x", &mut o));
        assert_eq!(o, Observation::default());
        assert_eq!(c.fast_hits(), 0);
        let mut other = StreamClassifier::new(Dialect::Anthropic);
        assert!(!other.read_line(b"[DONE]", &mut o));
    }

    #[test]
    fn holes_refuse_what_the_parser_might_read_otherwise() {
        let mut c = StreamClassifier::new(Dialect::OpenAi);
        c.classify(&chunk("a"));
        for text in ["\\u00e9", "\\x", "tab\there", "\"", "\\"] {
            let data = chunk(text);
            assert_eq!(c.classify(&data), openai::classify(&data), "{text}");
        }
        assert_eq!(c.fast_hits(), 0);
        let bad_utf8 = [&chunk("a")[..107], b"\xff\"}}]}"].concat();
        assert!(c.classify(&bad_utf8).malformed);
    }

    #[test]
    fn a_changed_timestamp_or_padding_still_matches() {
        let mut c = StreamClassifier::new(Dialect::OpenAi);
        let with = |created: &str, pad: &str, text: &str| {
            format!("{{\"id\":\"x\",\"created\":{created},\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}],\"obfuscation\":\"{pad}\"}}").into_bytes()
        };
        for (created, pad, text) in [("1", "ab", "x"), ("22", "", "yy"), ("-3", "zz", "")] {
            let data = with(created, pad, text);
            assert_eq!(c.classify(&data), openai::classify(&data));
        }
        assert_eq!(c.fast_hits(), 2);
        for created in ["1.5", "01", "1e3", "\"1\""] {
            let data = with(created, "", "x");
            assert_eq!(c.classify(&data), openai::classify(&data), "{created}");
        }
    }

    #[test]
    fn later_streams_read_even_their_first_chunks_through_the_shapes_earlier_ones_learned() {
        let stream = |id: &str| -> Vec<Vec<u8>> {
            let head = format!("{{\"id\":\"{id}\",\"object\":\"chat.completion.chunk\",\"created\":1764500000,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":");
            [
                r#"{"role":"assistant","content":""},"finish_reason":null}]}"#.to_owned(),
                r#"{"content":"Hi"},"finish_reason":null}]}"#.to_owned(),
                r#"{"content":" there"},"finish_reason":null}]}"#.to_owned(),
                r#"{},"finish_reason":"length"}]}"#.to_owned(),
                format!(
                    r#"{{}},"finish_reason":null}}],"usage":{{"prompt_tokens":5,"completion_tokens":{}}}}}"#,
                    id.len()
                ),
            ]
            .iter()
            .map(|rest| format!("{head}{rest}").into_bytes())
            .collect()
        };
        let shapes = Arc::new(Shapes::default());
        let mut hits = Vec::new();
        for id in [
            "chatcmpl-a1",
            "chatcmpl-b22",
            "chatcmpl-c333",
            "caf\u{e9}-\u{1f600}",
        ] {
            let mut c = StreamClassifier::sharing(Dialect::OpenAi, Arc::clone(&shapes));
            for data in stream(id) {
                let o = c.classify(&data);
                assert_eq!(
                    o,
                    openai::classify(&data),
                    "{}",
                    String::from_utf8_lossy(&data)
                );
                assert_eq!(o.id.as_deref(), Some(id));
            }
            hits.push(c.fast_hits());
        }
        // The first stream learns the role, content, finish and usage chunks (and reads its
        // second content chunk); the next read them all, their own token counts included.
        assert_eq!(hits, [1, 5, 5, 5]);
        assert_eq!(shapes.len(), 4);
        // An escaped id is read by the full classifier.
        let mut c = StreamClassifier::sharing(Dialect::OpenAi, Arc::clone(&shapes));
        for data in stream("a\\u0041") {
            assert_eq!(c.classify(&data), openai::classify(&data));
        }
        assert_eq!(c.fast_hits(), 0);
    }

    #[test]
    fn usage_counts_are_holes_and_a_count_that_is_not_keeps_its_shape_to_one_stream() {
        let usage = |counts: &str| {
            format!("{{\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1764500000,\"model\":\"m\",\"choices\":[],\"usage\":{{{counts}}}}}").into_bytes()
        };
        let shapes = Arc::new(Shapes::default());
        let mut c = StreamClassifier::sharing(Dialect::OpenAi, Arc::clone(&shapes));
        let full = r#""prompt_tokens":12,"total_tokens":30,"completion_tokens":18,"prompt_tokens_details":{"cached_tokens":8,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":3,"cached_tokens":1}"#;
        c.classify(&usage(full));
        assert_eq!(shapes.len(), 1);
        let hit = r#""prompt_tokens":0,"total_tokens":7,"completion_tokens":123456789012345678,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":99,"cached_tokens":1}"#;
        let mut hits = 0;
        for counts in [
            hit,
            // Misses: what the parser reads otherwise, or what the shape holds literally.
            r#""prompt_tokens":-1,"total_tokens":7,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":9,"cached_tokens":1}"#,
            r#""prompt_tokens":1.0,"total_tokens":7,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":9,"cached_tokens":1}"#,
            r#""prompt_tokens":01,"total_tokens":7,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":9,"cached_tokens":1}"#,
            r#""prompt_tokens":1,"total_tokens":7,"completion_tokens":1234567890123456789,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":9,"cached_tokens":1}"#,
            r#""prompt_tokens":1,"total_tokens":7,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":5},"completion_tokens_details":{"reasoning_tokens":9,"cached_tokens":1}"#,
            r#""prompt_tokens":1,"total_tokens":7,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":null,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":9,"cached_tokens":1}"#,
        ] {
            let mut c = StreamClassifier::sharing(Dialect::OpenAi, Arc::clone(&shapes));
            let data = usage(counts);
            assert_eq!(c.classify(&data), openai::classify(&data), "{counts}");
            hits += c.fast_hits();
        }
        assert_eq!(hits, 1);
        let data = usage(hit);
        let mut c = StreamClassifier::sharing(Dialect::OpenAi, Arc::clone(&shapes));
        let read = c.classify(&data);
        assert_eq!(c.fast_hits(), 1);
        assert_eq!(
            read.usage,
            Some(Usage {
                input: Some(0),
                output: Some(123_456_789_012_345_678),
                cached_input: Some(0),
                reasoning: Some(99),
            })
        );
        // A count the shape cannot hold (a float the parser reads as a count) keeps the
        // shape to its stream: read there, never shared.
        let shapes = Arc::new(Shapes::default());
        let mut c = StreamClassifier::sharing(Dialect::OpenAi, Arc::clone(&shapes));
        let float = usage(r#""prompt_tokens":5.0,"completion_tokens":2"#);
        assert_eq!(c.classify(&float).usage.and_then(|u| u.input), Some(5));
        assert_eq!(c.classify(&float), openai::classify(&float));
        assert_eq!((c.fast_hits(), shapes.len()), (1, 0));
    }

    #[test]
    fn shapes_it_does_not_learn() {
        for data in [
            &br#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"f"}}]}}]}"#[..],
            br#"{"choices":[{"delta":{"content":"a"},"message":{"content":"b"}}]}"#,
            br#"{"choices":[{"delta":{"con\u0074ent":"a"}}]}"#,
            br#"{"id":"a\nb","choices":[{"delta":{"content":"a"}}]}"#,
            br#"{"choices":[]}"#,
        ] {
            let mut c = StreamClassifier::new(Dialect::OpenAi);
            assert_eq!(c.classify(data), openai::classify(data));
            assert_eq!(c.classify(data), openai::classify(data));
            assert_eq!(c.fast_hits(), 0, "{}", String::from_utf8_lossy(data));
        }
    }
}
