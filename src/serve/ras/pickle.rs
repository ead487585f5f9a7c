//! A small, bounded, safe unpickler for plain data: what PyTorch's flight recorder
//! writes (torch/csrc/distributed/c10d FlightRecorder dump(): `pickle_str` of a dict of
//! dicts, lists, tuples, strings, ints, floats, bools and None, written by the TorchScript
//! pickler at protocol 2) and what Python's own pickle writes for such data at protocols
//! 2 to 5 (Lib/pickle.py, `_Pickler.save_*`; framing of protocol 4, MEMOIZE, the 8-byte
//! lengths).
//!
//! It only builds containers and scalars. Every opcode that names or calls Python code
//! (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, PERSID,
//! BINPERSID, EXT1/2/4, the out-of-band buffers) is refused, and so are the text opcodes
//! of protocol 0 and integers wider than 64 bits. Bounded: the input's size is the
//! caller's, and within it the values built (`MAX_VALUES`) and the MARK depth
//! (`MAX_MARKS`). Memoized values are shared, not copied (BINGET is O(1)), as Python's
//! memo shares them; readers walk known paths, never the whole graph.
//!
//! Why not a crate: serde-pickle, the one maintained Rust unpickler, is larger than this
//! whole module with its dependencies (num-bigint, iter-read), resolves some globals
//! (`__builtin__ set`, `bytearray`) rather than refusing every one, and has no budget on
//! what a hostile file makes it allocate; we would have to audit and wrap it all.

use std::collections::HashMap;
use std::rc::Rc;

/// The most values a pickle may build (a flight recorder dump of 2,000 entries builds
/// about 150,000).
const MAX_VALUES: usize = 1 << 20;
/// The deepest MARK nesting (PyTorch's dumps nest 4 deep).
const MAX_MARKS: usize = 256;

/// A value; containers live in the pickle's arena and are shared by index.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Rc<str>),
    /// Bytes are not kept: only their length.
    Bytes(usize),
    List(usize),
    Tuple(usize),
    Dict(usize),
    Set(usize),
}

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(n) => Some(*n),
            Value::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }
}

#[derive(Debug)]
enum Container {
    Seq(Vec<Value>),
    Map(Vec<(Value, Value)>),
}

/// A parsed pickle: its root value and the containers it refers to.
#[derive(Debug)]
pub struct Pickle {
    arena: Vec<Container>,
    pub root: Value,
}

impl Pickle {
    /// The items of a list, tuple or set; empty for anything else.
    pub fn items(&self, v: &Value) -> &[Value] {
        match v {
            Value::List(i) | Value::Tuple(i) | Value::Set(i) => match self.arena.get(*i) {
                Some(Container::Seq(items)) => items,
                _ => &[],
            },
            _ => &[],
        }
    }

    /// The key/value pairs of a dict; empty for anything else.
    pub fn pairs(&self, v: &Value) -> &[(Value, Value)] {
        match v {
            Value::Dict(i) => match self.arena.get(*i) {
                Some(Container::Map(pairs)) => pairs,
                _ => &[],
            },
            _ => &[],
        }
    }

    /// `dict[key]` for a string key (the last one set wins, as in Python).
    pub fn get(&self, v: &Value, key: &str) -> Option<&Value> {
        self.pairs(v)
            .iter()
            .rev()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }
}

/// Why a pickle was refused.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused(pub String);

struct Machine<'a> {
    data: &'a [u8],
    at: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: HashMap<u32, Value>,
    arena: Vec<Container>,
    built: usize,
}

fn refuse<T>(why: impl Into<String>) -> Result<T, Refused> {
    Err(Refused(why.into()))
}

impl<'a> Machine<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Refused> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.data.len());
        let Some(end) = end else {
            return refuse(format!("cut short at byte {} (wanted {n} more)", self.at));
        };
        let bytes = &self.data[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn uint(&mut self, n: usize) -> Result<u64, Refused> {
        let bytes = self.take(n)?;
        Ok(bytes
            .iter()
            .rev()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    /// A length within what is left of the input.
    fn len(&mut self, n: usize) -> Result<usize, Refused> {
        let len = self.uint(n)?;
        match usize::try_from(len) {
            Ok(l) if l <= self.data.len() - self.at => Ok(l),
            _ => refuse(format!("a length of {len} bytes past the end of the input")),
        }
    }

    fn push(&mut self, v: Value) -> Result<(), Refused> {
        self.built += 1;
        if self.built > MAX_VALUES {
            return refuse(format!("more than {MAX_VALUES} values"));
        }
        self.stack.push(v);
        Ok(())
    }

    fn pop(&mut self) -> Result<Value, Refused> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return refuse("a pop across a MARK");
        }
        self.stack
            .pop()
            .map_or_else(|| refuse("stack underflow"), Ok)
    }

    fn pop_mark(&mut self) -> Result<Vec<Value>, Refused> {
        let Some(mark) = self.marks.pop() else {
            return refuse("no MARK");
        };
        Ok(self.stack.split_off(mark.min(self.stack.len())))
    }

    fn new_container(&mut self, c: Container) -> usize {
        self.arena.push(c);
        self.arena.len() - 1
    }

    fn text(&mut self, n: usize) -> Result<Value, Refused> {
        let len = self.len(n)?;
        let bytes = self.take(len)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(Value::Str(Rc::from(s))),
            Err(_) => refuse("a string that is not UTF-8"),
        }
    }

    fn bytes(&mut self, n: usize) -> Result<Value, Refused> {
        let len = self.len(n)?;
        self.take(len)?;
        Ok(Value::Bytes(len))
    }

    /// LONG1/LONG4: little-endian two's complement, at most 8 bytes.
    fn long(&mut self, n: usize) -> Result<Value, Refused> {
        let len = self.len(n)?;
        if len > 8 {
            return refuse("an integer wider than 64 bits");
        }
        let bytes = self.take(len)?;
        let mut v: i64 = if bytes.last().is_some_and(|b| b & 0x80 != 0) {
            -1
        } else {
            0
        };
        for b in bytes.iter().rev() {
            v = (v << 8) | i64::from(*b);
        }
        Ok(Value::Int(v))
    }

    /// The sequence on top of the stack (after APPEND's items are popped), by index.
    fn target(&self, what: &str) -> Result<usize, Refused> {
        match self.stack.last() {
            Some(Value::List(i) | Value::Set(i) | Value::Dict(i)) => Ok(*i),
            _ => refuse(format!("{what} on something that is not a container")),
        }
    }

    fn extend(&mut self, items: Vec<Value>) -> Result<(), Refused> {
        let i = self.target("APPEND")?;
        match self.arena.get_mut(i) {
            Some(Container::Seq(seq)) => {
                seq.extend(items);
                Ok(())
            }
            _ => refuse("APPEND to a dict"),
        }
    }

    fn set_items(&mut self, items: Vec<Value>) -> Result<(), Refused> {
        if !items.len().is_multiple_of(2) {
            return refuse("SETITEMS with an odd number of items");
        }
        let i = self.target("SETITEM")?;
        let Some(Container::Map(map)) = self.arena.get_mut(i) else {
            return refuse("SETITEM on a list");
        };
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            map.push((k, v));
        }
        Ok(())
    }

    fn memo_put(&mut self, key: u32) -> Result<(), Refused> {
        let top = self.stack.last().cloned();
        match top {
            Some(v) => {
                self.memo.insert(key, v);
                Ok(())
            }
            None => refuse("PUT on an empty stack"),
        }
    }

    fn memo_get(&mut self, key: u32) -> Result<(), Refused> {
        match self.memo.get(&key).cloned() {
            Some(v) => self.push(v),
            None => refuse(format!("GET of memo {key}, never PUT")),
        }
    }

    /// One opcode; `Ok(true)` at STOP.
    fn step(&mut self) -> Result<bool, Refused> {
        let op = self.take(1)?[0];
        match op {
            0x80 => drop(self.take(1)?), // PROTO
            0x95 => drop(self.uint(8)?), // FRAME: a hint for readers that prefetch
            b'.' => return Ok(true),     // STOP
            b'(' => {
                if self.marks.len() >= MAX_MARKS {
                    return refuse(format!("MARKs nested deeper than {MAX_MARKS}"));
                }
                self.marks.push(self.stack.len());
            }
            b'0' => drop(self.pop()?),      // POP
            b'1' => drop(self.pop_mark()?), // POP_MARK
            b'2' => {
                let top = self.pop()?;
                self.stack.push(top.clone());
                self.push(top)?;
            }
            b'N' => self.push(Value::None)?,
            0x88 => self.push(Value::Bool(true))?,
            0x89 => self.push(Value::Bool(false))?,
            b'J' => {
                let n = self.uint(4)? as u32 as i32;
                self.push(Value::Int(i64::from(n)))?;
            }
            b'K' => {
                let n = self.uint(1)?;
                self.push(Value::Int(n as i64))?;
            }
            b'M' => {
                let n = self.uint(2)?;
                self.push(Value::Int(n as i64))?;
            }
            0x8a => {
                let v = self.long(1)?;
                self.push(v)?;
            }
            0x8b => {
                let v = self.long(4)?;
                self.push(v)?;
            }
            b'G' => {
                let bits = self
                    .take(8)?
                    .iter()
                    .fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
                self.push(Value::Float(f64::from_bits(bits)))?;
            }
            _ => return self.step_more(op),
        }
        Ok(false)
    }

    /// Strings, containers and the memo.
    fn step_more(&mut self, op: u8) -> Result<bool, Refused> {
        let value = match op {
            0x8c => self.text(1)?,         // SHORT_BINUNICODE
            b'X' => self.text(4)?,         // BINUNICODE
            0x8d => self.text(8)?,         // BINUNICODE8
            b'U' => self.bytes(1)?,        // SHORT_BINSTRING (Python 2 str)
            b'T' => self.bytes(4)?,        // BINSTRING
            b'C' => self.bytes(1)?,        // SHORT_BINBYTES
            b'B' => self.bytes(4)?,        // BINBYTES
            0x8e | 0x96 => self.bytes(8)?, // BINBYTES8, BYTEARRAY8
            b']' => Value::List(self.new_container(Container::Seq(Vec::new()))),
            b'}' => Value::Dict(self.new_container(Container::Map(Vec::new()))),
            b')' => Value::Tuple(self.new_container(Container::Seq(Vec::new()))),
            0x8f => Value::Set(self.new_container(Container::Seq(Vec::new()))),
            b'l' | b't' | 0x91 => {
                let items = self.pop_mark()?;
                let i = self.new_container(Container::Seq(items));
                match op {
                    b'l' => Value::List(i),
                    b't' => Value::Tuple(i),
                    _ => Value::Set(i),
                }
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.pop()?);
                }
                items.reverse();
                Value::Tuple(self.new_container(Container::Seq(items)))
            }
            b'd' => {
                let items = self.pop_mark()?;
                let i = self.new_container(Container::Map(Vec::new()));
                self.stack.push(Value::Dict(i));
                self.set_items(items)?;
                self.stack.pop();
                Value::Dict(i)
            }
            _ => return self.step_mutate(op),
        };
        self.push(value)?;
        Ok(false)
    }

    /// Opcodes that change what is on the stack or in the memo.
    fn step_mutate(&mut self, op: u8) -> Result<bool, Refused> {
        match op {
            b'a' => {
                let v = self.pop()?;
                self.extend(vec![v])?;
            }
            b'e' | 0x90 => {
                let items = self.pop_mark()?;
                self.extend(items)?;
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                self.set_items(vec![k, v])?;
            }
            b'u' => {
                let items = self.pop_mark()?;
                self.set_items(items)?;
            }
            b'q' => {
                let key = self.uint(1)? as u32;
                self.memo_put(key)?;
            }
            b'r' => {
                let key = self.uint(4)? as u32;
                self.memo_put(key)?;
            }
            0x94 => {
                let key = u32::try_from(self.memo.len()).unwrap_or(u32::MAX);
                self.memo_put(key)?;
            }
            b'h' => {
                let key = self.uint(1)? as u32;
                self.memo_get(key)?;
            }
            b'j' => {
                let key = self.uint(4)? as u32;
                self.memo_get(key)?;
            }
            b'c'
            | 0x93
            | b'R'
            | b'b'
            | b'i'
            | b'o'
            | 0x81
            | 0x92
            | b'P'
            | b'Q'
            | 0x82..=0x84
            | 0x97
            | 0x98 => {
                return refuse(format!(
                    "opcode 0x{op:02x} at byte {} builds Python objects: refused",
                    self.at - 1
                ));
            }
            _ => {
                return refuse(format!(
                    "opcode 0x{op:02x} at byte {} is not one of protocol 2-5's plain-data opcodes",
                    self.at - 1
                ));
            }
        }
        Ok(false)
    }
}

/// Parses `data`, which must end with STOP.
pub fn parse(data: &[u8]) -> Result<Pickle, Refused> {
    let mut m = Machine {
        data,
        at: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        arena: Vec::new(),
        built: 0,
    };
    while !m.step()? {}
    let root = m
        .stack
        .pop()
        .map_or_else(|| refuse("STOP on an empty stack"), Ok)?;
    Ok(Pickle {
        arena: m.arena,
        root,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pickle.dumps({"d": b"zz"}, protocol=2)`: Python 2's protocol writes bytes as a
    /// call of `_codecs.encode`, a GLOBAL and a REDUCE.
    const BYTES_P2: &[u8] = b"\x80\x02}q\x00X\x01\x00\x00\x00dq\x01c_codecs\nencode\nq\x02X\x02\x00\x00\x00zzq\x03X\x06\x00\x00\x00latin1q\x04\x86q\x05Rq\x06s.";

    #[test]
    fn refuses_python_objects_even_inside_plain_data() {
        let e = parse(BYTES_P2).unwrap_err();
        assert!(
            e.0.contains("opcode 0x63") && e.0.contains("refused"),
            "{e:?}"
        );
        for evil in [
            &b"cos\nsystem\n(S'id'\ntR."[..],
            b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93.",
            b"\x80\x02cbuiltins\nstr\n.",
        ] {
            assert!(parse(evil).is_err(), "{evil:?}");
        }
    }

    /// The value as JSON (tuples and sets as arrays), `depth` deep at most.
    fn to_json(p: &Pickle, v: &Value, depth: usize) -> serde_json::Value {
        use serde_json::Value as J;
        if depth == 0 {
            return J::Null;
        }
        match v {
            Value::None => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(n) => J::from(*n),
            Value::Float(f) => J::from(*f),
            Value::Str(s) => J::from(&**s),
            Value::Bytes(n) => J::from(format!("<{n} bytes>")),
            Value::Dict(_) => J::Object(
                p.pairs(v)
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().unwrap_or("?").to_string(),
                            to_json(p, v, depth - 1),
                        )
                    })
                    .collect(),
            ),
            _ => J::Array(
                p.items(v)
                    .iter()
                    .map(|i| to_json(p, i, depth - 1))
                    .collect(),
            ),
        }
    }

    /// Differential: the same plain data pickled by CPython 3.11 at protocols 2 to 5
    /// (scripts/fr_dump.py fixtures) reads back as Python wrote it, its shared list
    /// included; nothing is taken from the files' own parse but their bytes.
    #[test]
    fn python_pickles_of_every_protocol_read_back_as_written() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/flight-recorder");
        let expected: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(format!("{dir}/plain.json")).unwrap())
                .unwrap();
        for proto in 2..=5 {
            let data = std::fs::read(format!("{dir}/plain-p{proto}.pickle")).unwrap();
            let p = parse(&data).unwrap();
            assert_eq!(to_json(&p, &p.root, 16), expected, "protocol {proto}");
            assert_eq!(
                p.get(&p.root, "shared"),
                p.get(p.get(&p.root, "nested").unwrap(), "l")
            );
        }
    }

    #[test]
    fn cut_and_hostile_inputs_are_refused_with_a_reason() {
        for (data, why) in [
            (&b""[..], "cut short"),
            (b"\x80\x02]", "cut short"),
            (b"X\xff\xff\xff\x7f", "past the end"),
            (
                b"\x8b\x10\x00\x00\x00AAAAAAAAAAAAAAAA.",
                "wider than 64 bits",
            ),
            (b"a.", "underflow"),
            (b"(a.", "pop across a MARK"),
            (b"K\x01a.", "not a container"),
            (b"h\x05.", "never PUT"),
            (b"}(K\x01u.", "odd number"),
            (b"I12\n.", "plain-data opcodes"),
            (b".", "empty stack"),
        ] {
            let e = parse(data).unwrap_err();
            assert!(e.0.contains(why), "{data:?}: {e:?}");
        }
        let deep = vec![b'('; MAX_MARKS + 1];
        assert!(parse(&deep).unwrap_err().0.contains("deeper"));
        // A million NONEs: the value budget, not memory, ends it.
        let mut flood = vec![b'N'; MAX_VALUES + 1];
        flood.push(b'.');
        assert!(parse(&flood).unwrap_err().0.contains("values"));
    }

    /// Seeded fuzz: mutations of a real-shaped dump never panic, and what parses walks.
    #[test]
    fn fuzz_mutated_pickles_never_panic() {
        let base = include_bytes!("../../../tests/data/flight-recorder/dump-2.10.pickle");
        let mut state = crate::test_facts::fuzz_seed(0x91c);
        for _ in 0..crate::test_facts::fuzz_iterations(2000) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mut bytes = base.to_vec();
            for k in 0..1 + (state >> 60) as u32 {
                let at = (state.rotate_right(k * 7) as usize) % bytes.len();
                bytes[at] = state.rotate_right(k * 5 + 3) as u8;
            }
            bytes.truncate(bytes.len() - (state as usize >> 20) % 16);
            if let Ok(p) = parse(&bytes) {
                let _ = super::super::flight::Dump::from_pickle(&p);
            }
        }
    }
}
