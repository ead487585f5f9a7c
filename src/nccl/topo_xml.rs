//! NCCL's XML reader (NVIDIA/nccl src/graph/xml.cc `xmlGetNode`, `xmlLoadSub`,
//! `ncclTopoGetXmlFromFile`, `ncclTopoGetXmlGraphFromFile`), reimplemented byte for
//! byte, so a topology (NCCL_TOPO_FILE, or the default
//! /var/run/nvidia-topologyd/virtualTopology.xml) or graph file (NCCL_GRAPH_FILE) is
//! judged by what NCCL makes of it. It is not XML: blanks between tokens are a space,
//! a newline or a carriage return (a tab is part of a name), attributes end a tag only
//! on one line, values must be quoted (`"` only before 2.27, `'` too from v2.27.3-1),
//! a `<?xml ...?>` declaration is an error, and names and values hold at most 254 and
//! 253 bytes. Elements NCCL has no handler for are read and dropped. Any error fails
//! the communicator's init with ncclInternalError (a wrong `version`: ncclInvalidUsage).

use crate::nccl::Version;
use crate::nccl::version::{XML_GRAPH_NODES, XML_LIMITS, XML_SINGLE_QUOTES};

/// MAX_STR_LEN (src/graph/xml.h): a name or value buffer holds 255 bytes with its NUL.
const MAX_STR_LEN: usize = 255;
/// MAX_ATTR_COUNT: attributes past it overwrite the last slot.
const MAX_ATTR_COUNT: usize = 16;

/// Which file NCCL reads: it decides the element handlers and the node limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// NCCL_TOPO_FILE: `<system version="1">` of `<cpu>`s of `<pci>`, `<nic>`, `<gpu>`.
    Topology,
    /// NCCL_GRAPH_FILE: `<graphs version="1">` of `<graph>`s of `<channel>`s.
    Graph,
}

/// One element NCCL kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub attrs: Vec<(String, String)>,
    pub parent: Option<usize>,
}

impl Node {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Why NCCL rejects a file: its WARN text.
pub type Error = String;

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    quotes: &'static [u8],
}

impl Reader<'_> {
    fn next(&mut self) -> Option<u8> {
        let c = self.bytes.get(self.at).copied();
        self.at += usize::from(c.is_some());
        c
    }

    /// xmlGetChar.
    fn char(&mut self) -> Result<u8, Error> {
        self.next()
            .ok_or_else(|| "XML Parse : Unexpected EOF".to_string())
    }

    /// From 2.27 NCCL checks the length; before, it overflows its buffer.
    fn too_long(&self, what: &str, text: &[u8]) -> Error {
        format!(
            "Error : {what} {} too long (max {MAX_STR_LEN})",
            String::from_utf8_lossy(text)
        )
    }

    /// xmlGetValue: a quoted value, then the byte after it.
    fn value(&mut self) -> Result<(String, u8), Error> {
        let quote = self.char()?;
        if !self.quotes.contains(&quote) {
            return Err("XML Parse : Expected (double) quote.".to_string());
        }
        let mut v = Vec::new();
        loop {
            let c = self.char()?;
            v.push(c);
            if v.len() == MAX_STR_LEN {
                v.pop();
                return Err(self.too_long("value", &v));
            }
            if c == quote {
                break;
            }
        }
        v.pop();
        let last = self.char()?;
        Ok((String::from_utf8_lossy(&v).into_owned(), last))
    }

    /// xmlGetToken: a name up to a delimiter, or `name=value` where a value is allowed.
    fn token(&mut self, value_allowed: bool) -> Result<(String, Option<String>, u8), Error> {
        let mut name = Vec::new();
        loop {
            let c = self.char()?;
            if c == b'=' {
                let name = String::from_utf8_lossy(&name).into_owned();
                if !value_allowed {
                    return Err(format!("XML Parse : Unexpected value with name {name}"));
                }
                let (v, last) = self.value()?;
                return Ok((name, Some(v), last));
            }
            name.push(c);
            if name.len() == MAX_STR_LEN {
                name.pop();
                return Err(self.too_long("name", &name));
            }
            if matches!(c, b' ' | b'>' | b'/' | b'\n' | b'\r') {
                name.pop();
                return Ok((String::from_utf8_lossy(&name).into_owned(), None, c));
            }
        }
    }

    /// xmlSkipComment: up to and including `-->`, the token's tail counted.
    fn skip_comment(&mut self, start: &[u8], next: u8) -> Result<(), Error> {
        let mut end = *b"...";
        let mut shift = |c: u8| {
            end = [end[1], end[2], c];
            &end == b"-->"
        };
        let mut done = false;
        for c in start.iter().chain([&next]) {
            done = shift(*c);
        }
        while !done {
            let c = self
                .next()
                .ok_or_else(|| "XML Parse error : unterminated comment".to_string())?;
            done = shift(c);
        }
        Ok(())
    }
}

/// What xmlGetNode read.
enum Read {
    None,
    Close(String),
    Open { node: Node, single: bool },
}

impl Reader<'_> {
    /// xmlGetNode.
    fn node(&mut self) -> Result<Read, Error> {
        loop {
            let mut c = b' ';
            while matches!(c, b' ' | b'\n' | b'\r') {
                match self.next() {
                    Some(b) => c = b,
                    None => return Ok(Read::None),
                }
            }
            if c != b'<' {
                return Err(format!(
                    "XML Parse error : expecting '<', got '{}'",
                    char::from(c).escape_default()
                ));
            }
            let (name, _, mut c) = self.token(false)?;
            if let Some(rest) = name.strip_prefix("!--") {
                self.skip_comment(rest.as_bytes(), c)?;
                continue;
            }
            if name.is_empty() && c == b'/' {
                let (name, _, c) = self.token(false)?;
                if c != b'>' {
                    return Err(format!(
                        "XML Parse error : unexpected trailing {} in closing tag {name}",
                        char::from(c).escape_default()
                    ));
                }
                return Ok(Read::Close(name));
            }
            let mut attrs: Vec<(String, String)> = Vec::new();
            while c == b' ' {
                let (key, value, last) = self.token(true)?;
                c = last;
                let attr = (key, value.unwrap_or_default());
                if attrs.len() == MAX_ATTR_COUNT {
                    attrs[MAX_ATTR_COUNT - 1] = attr;
                } else {
                    attrs.push(attr);
                }
            }
            let mut single = false;
            if c == b'/' {
                single = true;
                c = self.token(false)?.2;
            }
            if c != b'>' {
                return Err(format!(
                    "XML Parse : expected >, got '{}'",
                    char::from(c).escape_default()
                ));
            }
            let node = Node {
                name,
                attrs,
                parent: None,
            };
            return Ok(Read::Open { node, single });
        }
    }
}

/// The element handlers of `kind` (src/graph/xml.cc ncclTopoXmlLoad*, ncclTopoXmlGraphLoad*):
/// which children an element keeps.
fn handlers(kind: Kind, parent: Option<&str>) -> &'static [&'static str] {
    match (kind, parent) {
        (Kind::Topology, None) => &["system"],
        (Kind::Topology, Some("system")) => &["cpu"],
        (Kind::Topology, Some("cpu")) => &["pci", "nic"],
        (Kind::Topology, Some("pci")) => &["pci", "gpu", "nic", "pcilink"],
        (Kind::Topology, Some("gpu")) => &["nvlink", "c2c"],
        (Kind::Topology, Some("nic")) => &["net"],
        (Kind::Graph, None) => &["graphs"],
        (Kind::Graph, Some("graphs")) => &["graph"],
        (Kind::Graph, Some("graph")) => &["channel"],
        (Kind::Graph, Some("channel")) => &["net", "gpu"],
        _ => &[],
    }
}

struct Loader<'a> {
    reader: Reader<'a>,
    kind: Kind,
    nodes: Vec<Node>,
    max_nodes: usize,
    max_subs: usize,
}

impl Loader<'_> {
    /// xmlLoadSub: the children of `head` (None: the document) until its closing tag.
    /// `head` is the element's name and, when NCCL keeps it, its index; the children of
    /// an element NCCL keeps no handler for are read and dropped the same way.
    fn load(&mut self, head: Option<(&str, Option<usize>)>) -> Result<(), Error> {
        let mut subs = 0;
        loop {
            if self.nodes.len() == self.max_nodes {
                return Err(format!(
                    "Error : XML parser is limited to {} nodes",
                    self.max_nodes
                ));
            }
            let (node, single) = match self.reader.node()? {
                Read::None => {
                    return match head {
                        Some((h, _)) => Err(format!("XML Parse : unterminated {h}")),
                        None => Ok(()),
                    };
                }
                Read::Close(name) => match head {
                    Some((h, _)) if h != name => {
                        return Err(format!("XML Mismatch : {h} / {name}"));
                    }
                    Some(_) => return Ok(()),
                    // A closing tag at the top: read as an element of that name.
                    None => {
                        let node = Node {
                            name,
                            attrs: Vec::new(),
                            parent: None,
                        };
                        (node, false)
                    }
                },
                Read::Open { node, single } => (node, single),
            };
            let index = match head {
                None => Some(None),
                Some((_, Some(i))) => Some(Some(i)),
                Some((_, None)) => None,
            }
            .filter(|_| handlers(self.kind, head.map(|(h, _)| h)).contains(&node.name.as_str()));
            let Some(parent) = index else {
                if !single {
                    self.load(Some((&node.name, None)))?;
                }
                continue;
            };
            if parent.is_some() {
                if subs == self.max_subs {
                    return Err(format!(
                        "Error : XML parser is limited to {} subnodes",
                        self.max_subs
                    ));
                }
                subs += 1;
            }
            let name = node.name.clone();
            self.nodes.push(Node { parent, ..node });
            let index = self.nodes.len() - 1;
            self.check_version(index)?;
            if !single {
                self.load(Some((&name, Some(index))))?;
            }
        }
    }

    /// ncclTopoXmlLoadSystem / ncclTopoXmlGraphLoadGraphs: `version` must be 1.
    fn check_version(&self, index: usize) -> Result<(), Error> {
        let node = &self.nodes[index];
        let what = match (self.kind, node.name.as_str()) {
            (Kind::Topology, "system") => "Topology",
            (Kind::Graph, "graphs") => "Graph",
            _ => return Ok(()),
        };
        let Some(v) = node.attr("version") else {
            return Err(format!("Attribute version of node {} not found", node.name));
        };
        let n = crate::nccl::catalog::strtoll(v).value().unwrap_or(-1);
        if n != 1 {
            return Err(format!("XML {what} has wrong version {n}, 1 needed"));
        }
        Ok(())
    }
}

/// The elements NCCL `version` keeps from `text` (a file of `kind`), in document order,
/// or NCCL's error. An unknown version reads as the newest.
pub fn parse(text: &[u8], kind: Kind, version: Option<Version>) -> Result<Vec<Node>, Error> {
    let since = |at: Version| version.is_none_or(|v| v >= at);
    let (max_nodes, max_subs) = match kind {
        _ if !since(XML_LIMITS) => (1024, 32),
        Kind::Topology => (256, 128),
        Kind::Graph if since(XML_GRAPH_NODES) => (65536, 128),
        Kind::Graph => (4096, 128),
    };
    let mut loader = Loader {
        reader: Reader {
            bytes: text,
            at: 0,
            quotes: if since(XML_SINGLE_QUOTES) {
                b"\"'"
            } else {
                b"\""
            },
        },
        kind,
        nodes: Vec::new(),
        max_nodes,
        max_subs,
    };
    loader.load(None)?;
    Ok(loader.nodes)
}

/// What a topology describes: the PCI bus ids of its GPUs (a `pci` of class 0x03xxxx,
/// or one holding a `gpu`) and NICs (class 0x02xxxx, or holding a `nic`), and the names
/// of its `net` devices, as the file writes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Described {
    pub gpus: Vec<String>,
    pub nics: Vec<String>,
    pub(crate) nets: Vec<String>,
}

pub fn described(nodes: &[Node]) -> Described {
    let mut out = Described::default();
    for (i, n) in nodes.iter().enumerate() {
        if n.name == "net" {
            out.nets.extend(n.attr("name").map(str::to_string));
        }
        if n.name != "pci" {
            continue;
        }
        let Some(busid) = n.attr("busid") else {
            continue;
        };
        let child = |name: &str| nodes.iter().any(|c| c.parent == Some(i) && c.name == name);
        let class = n.attr("class").unwrap_or("");
        if class.starts_with("0x03") || child("gpu") {
            out.gpus.push(busid.to_string());
        } else if class.starts_with("0x02") || child("nic") {
            out.nics.push(busid.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEW: Option<Version> = Some(Version::new(2, 28, 9));
    const OLD: Option<Version> = Some(Version::new(2, 21, 5));

    fn topo(text: &str) -> Result<Vec<Node>, Error> {
        parse(text.as_bytes(), Kind::Topology, NEW)
    }

    const GOOD: &str = "<!-- a comment -->\n<system version=\"1\">\n  <cpu numaid=\"0\" arch=\"x86_64\">\n    <pci busid=\"0000:10:1c.0\" class=\"0x030200\"/> <!-- GPU 0 -->\n    <pci busid=\"0000:10:1b.0\" class=\"0x020000\">\n      <nic>\n        <net name=\"rdmap16s27\" dev=\"0\"/>\n      </nic>\n    </pci>\n    <unknown foo=\"1\"><pci busid=\"x\"/></unknown>\n  </cpu>\n</system>\n";

    #[test]
    fn a_topology_nccl_reads() {
        let nodes = topo(GOOD).unwrap();
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["system", "cpu", "pci", "pci", "nic", "net"]);
        assert_eq!(nodes[2].attr("busid"), Some("0000:10:1c.0"));
        assert_eq!(nodes[5].parent, Some(4));
        let d = described(&nodes);
        assert_eq!(d.gpus, ["0000:10:1c.0"]);
        assert_eq!(d.nics, ["0000:10:1b.0"]);
        assert_eq!(d.nets, ["rdmap16s27"]);
    }

    #[test]
    fn what_nccl_refuses_and_xml_allows() {
        for (text, error) in [
            (
                "<?xml version=\"1.0\"?>\n<system version=\"1\"/>",
                "expected >, got '?'",
            ),
            ("\t<system version=\"1\"/>", "expecting '<', got '\\t'"),
            ("<system\n version=\"1\"/>", "expected >, got '\\n'"),
            ("<system version=1/>", "Expected (double) quote."),
            (
                "<system version=\"2\"/>",
                "XML Topology has wrong version 2, 1 needed",
            ),
            ("<system/>", "Attribute version of node system not found"),
            (
                "<system version=\"1\"><cpu></system>",
                "XML Mismatch : cpu / system",
            ),
            (
                "<system version=\"1\"><cpu>",
                "XML Parse : unterminated cpu",
            ),
            ("<system version=\"1\"", "Unexpected EOF"),
            ("<!-- open", "unterminated comment"),
            ("<!--a=b -->", "Unexpected value with name !--a"),
        ] {
            let e = topo(text).unwrap_err();
            assert!(e.contains(error), "{text:?}: {e}");
        }
        // Single quotes from 2.27 only.
        let single = "<system version='1'/>";
        assert!(topo(single).is_ok());
        assert!(
            parse(single.as_bytes(), Kind::Topology, OLD)
                .unwrap_err()
                .contains("quote")
        );
        // An empty file is an empty topology: NCCL detects everything itself.
        assert_eq!(topo("\n  \n"), Ok(vec![]));
    }

    #[test]
    fn limits_per_release() {
        let cpus = |n: usize| format!("<system version=\"1\">{}</system>", "<cpu/>".repeat(n));
        assert!(topo(&cpus(128)).is_ok());
        assert!(
            topo(&cpus(129))
                .unwrap_err()
                .contains("limited to 128 subnodes")
        );
        let old = parse(cpus(40).as_bytes(), Kind::Topology, OLD);
        assert!(old.is_ok(), "2.21 has MAX_SUBS 128");
        let older = parse(
            cpus(40).as_bytes(),
            Kind::Topology,
            Some(Version::new(2, 20, 5)),
        );
        assert!(older.unwrap_err().contains("limited to 32 subnodes"));
        let pcis = format!(
            "<system version=\"1\">{}</system>",
            "<cpu>".to_string() + &"<pci/>".repeat(100) + "</cpu>"
        );
        let many = format!("{pcis}{pcis}{pcis}").replace("</system><system version=\"1\">", "");
        assert!(topo(&many).unwrap_err().contains("limited to 256 nodes"));
        let long = format!("<system version=\"1\" name=\"{}\"/>", "n".repeat(253));
        assert!(topo(&long).is_ok());
        let longer = format!("<system version=\"1\" name=\"{}\"/>", "n".repeat(254));
        assert!(topo(&longer).unwrap_err().contains("too long (max 255)"));
    }

    #[test]
    fn graph_files() {
        let g = "<graphs version=\"1\">\n<graph id=\"0\" pattern=\"4\">\n<channel>\n<gpu dev=\"0\"/>\n</channel>\n</graph>\n</graphs>\n";
        let nodes = parse(g.as_bytes(), Kind::Graph, NEW).unwrap();
        assert_eq!(nodes.len(), 4);
        let e = parse(b"<graphs version=\"3\"/>", Kind::Graph, NEW).unwrap_err();
        assert!(e.contains("XML Graph has wrong version 3"), "{e}");
    }

    #[test]
    fn aws_ofi_nccl_topologies_parse() {
        // ../shared/data: aws-ofi-nccl's shipped topology files (p4d, p4de, g5).
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/data/aws-ofi-nccl-topology");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            assert!(
                std::env::var_os("NCCL_PREFLIGHT_TEST_STRICT").is_none(),
                "{} missing",
                dir.display()
            );
            eprintln!("skipped: {} not beside the repository", dir.display());
            return;
        };
        let mut seen = 0;
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_none_or(|x| x != "xml") {
                continue;
            }
            let text = std::fs::read(&path).unwrap();
            let nodes = parse(&text, Kind::Topology, NEW)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(nodes[0].name, "system", "{}", path.display());
            seen += 1;
        }
        assert_eq!(seen, 3);
    }
}
