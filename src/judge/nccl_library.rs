//! `nccl-library`: the libnccl the trainer's process will load, and every other
//! copy the image holds.
//!
//! Which file a trainer loads is the loader's and Python's decision, not NCCL's
//! (gather/trainer_path.rs): a PyTorch wheel's `nvidia/nccl/lib` through
//! libtorch_cuda.so's RUNPATH, unless LD_LIBRARY_PATH names a directory with another
//! libnccl.so.2. Every version-dependent check, `bench` and the gang judge that
//! library. An image with two different versions works for the process that loads
//! one of them, but any other launcher (a C++ binary, another interpreter, an
//! LD_LIBRARY_PATH set by an operator) loads the other; measured on the lent GPU
//! machine: the system libnccl 2.28.3 beside PyTorch's 2.28.9, and a pod on 2.28.3
//! among 2.28.9 never completes NCCL's join with 4 pods (FACTS.md section 9).

use super::Finding;
use crate::facts::gpu::LibraryState;
use crate::facts::rdma::NcclCopy;
use crate::facts::{Facts, ImageRole, Observed};
use crate::finding::Outcome;
use crate::policy::Policy;
use crate::predict::Prediction;

pub const ID: &str = "nccl-library";

fn version_of(c: &NcclCopy) -> Option<&str> {
    c.version.value().map(String::as_str)
}

fn copy_line(c: &NcclCopy) -> String {
    let version = match &c.version {
        Observed::Value(v) => v.clone(),
        Observed::Error(e) => format!("version unknown: {e}"),
    };
    format!("{} ({version}; {})", c.path, c.found_by)
}

fn two_versions(loaded: &str, version: &str, found_by: &str, others: &[&NcclCopy]) -> Finding {
    let listed: Vec<String> = others
        .iter()
        .map(|c| {
            format!(
                "{} at {} ({})",
                version_of(c).unwrap_or("?"),
                c.path,
                c.found_by
            )
        })
        .collect();
    let dir = loaded.rsplit_once('/').map_or(loaded, |(d, _)| d);
    Finding::predicts(
        ID,
        Outcome::undetermined(
            "whether every process of the job loads the same NCCL: pods or processes on different versions fail to form a communicator (\"Mismatched NCCL version detected\") or hang in its bootstrap",
        ),
        format!(
            "this image holds NCCL {version} ({found_by}, which the trainer loads) and also {}: \
             another launcher or LD_LIBRARY_PATH loads the other, and pods on different NCCL \
             versions cannot form one communicator",
            listed.join(", ")
        ),
        format!(
            "Keep one libnccl in the image: remove the copies the trainer does not load \
             (pip uninstall the nvidia-nccl wheel, or remove the system libnccl2 package), or \
             make every process load the same one: export LD_LIBRARY_PATH={dir}:$LD_LIBRARY_PATH. \
             Build every pod of a job from the same image."
        ),
    )
}

pub fn judge(facts: &Facts, _prediction: &Prediction, _policy: &Policy) -> Finding {
    let nccl = &facts.rdma.nccl;
    let mut finding = match &nccl.library.state {
        LibraryState::Skipped { reason } if facts.image == ImageRole::Own => {
            Finding::skip(ID, format!("libnccl not judged: {reason}"))
        }
        LibraryState::Skipped { reason } => {
            Finding::skip(ID, format!("libnccl not looked for: {reason}"))
        }
        LibraryState::NotFound { message } => {
            Finding::skip(ID, "no libnccl in this image").evidence(format!("tried: {message}"))
        }
        // The trainer's framework links libnccl.so.2 (libtorch_cuda.so's DT_NEEDED): a
        // libnccl that does not load stops the framework's import.
        LibraryState::Failed(e) => Finding::predicts(
            ID,
            Outcome::cannot_start(format!(
                "the trainer's NCCL does not load ({}), so neither does the framework that links it",
                e.message
            )),
            format!("{} does not load: {}", nccl.library.library, e.message),
            "The trainer's NCCL must load where it runs: install the NCCL its framework was built \
             with (for PyTorch, the nvidia-nccl wheel its requirements name) and check that its \
             dependencies resolve (`ldd` on the library).",
        ),
        LibraryState::Loaded(lib) => {
            let path = lib
                .path
                .clone()
                .unwrap_or_else(|| nccl.library.library.clone());
            let found_by = lib.found_by.clone().unwrap_or_else(|| "the loader".into());
            match &lib.version {
                Observed::Error(e) => Finding::predicts(
                    ID,
                    Outcome::undetermined(format!(
                        "which NCCL release {path} is, and so what it does"
                    )),
                    format!("could not read the version of {path}: {e}"),
                    "Check the library is a real libnccl.so.2 (`strings` on it shows `NCCL version`).",
                ),
                Observed::Value(version) => {
                    let others: Vec<&NcclCopy> = nccl
                        .copies
                        .iter()
                        .filter(|c| c.path != path)
                        .filter(|c| version_of(c).is_some_and(|v| v != version))
                        .collect();
                    if others.is_empty() {
                        Finding::pass(
                            ID,
                            format!("the trainer loads NCCL {version} from {path} ({found_by})"),
                        )
                    } else {
                        two_versions(&path, version, &found_by, &others)
                    }
                }
            }
        }
    };
    for c in &nccl.copies {
        finding = finding.evidence(format!("found: {}", copy_line(c)));
    }
    finding
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::FactError;
    use crate::facts::rdma::NcclLibrary;
    use crate::finding::Status;
    use crate::test_facts::healthy;

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    const WHEEL: &str =
        "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2";
    const SYSTEM: &str = "/usr/lib/x86_64-linux-gnu/libnccl.so.2";

    fn copy(path: &str, found_by: &str, version: &str) -> NcclCopy {
        NcclCopy {
            path: path.into(),
            found_by: found_by.into(),
            version: Observed::Value(version.into()),
        }
    }

    /// The lent GPU machine's image: PyTorch's wheel 2.28.9 through torch's RUNPATH,
    /// and the system's 2.28.3 in ld.so.cache.
    fn torch_image() -> Facts {
        let mut f = healthy();
        f.rdma.nccl.library.state = LibraryState::Loaded(NcclLibrary {
            path: Some(WHEEL.into()),
            version: Observed::Value("2.28.9".into()),
            found_by: Some("RUNPATH of libtorch_cuda.so".into()),
        });
        f.rdma.nccl.copies = vec![
            copy(WHEEL, "RUNPATH of libtorch_cuda.so", "2.28.9"),
            copy(SYSTEM, "LD_LIBRARY_PATH / ld.so.cache", "2.28.3"),
        ];
        f
    }

    #[test]
    fn one_version_passes_naming_the_library_and_how_it_is_reached() {
        let mut f = torch_image();
        f.rdma.nccl.copies[1].version = Observed::Value("2.28.9".into());
        let got = judge(&f, &Policy::default());
        assert_eq!(got.status(), Status::Pass, "{got:?}");
        assert!(
            got.summary.contains("NCCL 2.28.9 from /opt/torch"),
            "{}",
            got.summary
        );
        assert!(
            got.summary.contains("RUNPATH of libtorch_cuda.so"),
            "{}",
            got.summary
        );
        assert_eq!(got.evidence.len(), 2);
    }

    #[test]
    fn two_versions_in_one_image_warn_naming_both_and_the_trainers() {
        let got = judge(&torch_image(), &Policy::default());
        assert_eq!(got.status(), Status::Warn);
        assert!(
            got.summary
                .contains("NCCL 2.28.9 (RUNPATH of libtorch_cuda.so, which the trainer loads)"),
            "{}",
            got.summary
        );
        assert!(
            got.summary
                .contains("2.28.3 at /usr/lib/x86_64-linux-gnu/libnccl.so.2"),
            "{}",
            got.summary
        );
        let fix = got.remediation().unwrap_or_default();
        assert!(
            fix.contains(
                "LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:"
            ),
            "{fix}"
        );
    }

    #[test]
    fn a_copy_that_does_not_load_is_listed_not_compared() {
        let mut f = torch_image();
        f.rdma.nccl.copies[1].version = Observed::Error(FactError::new(SYSTEM, "wrong ELF class"));
        let got = judge(&f, &Policy::default());
        assert_eq!(got.status(), Status::Pass);
        assert!(
            got.evidence.iter().any(|e| e.contains("wrong ELF class")),
            "{:?}",
            got.evidence
        );
    }

    #[test]
    fn absent_skips_broken_fails_and_undated_warns() {
        let mut f = healthy();
        f.rdma.nccl.copies.clear();
        f.rdma.nccl.library.state = LibraryState::NotFound {
            message: "libnccl.so.2: cannot open shared object file".into(),
        };
        assert_eq!(judge(&f, &Policy::default()).status(), Status::Skip);
        f.rdma.nccl.library.state =
            LibraryState::Failed(FactError::new(WHEEL, "undefined symbol: cudaFree"));
        // Issue 36: the framework links it, so a libnccl that does not load stops the
        // job before NCCL runs: a job that cannot start, the image's.
        let got = judge(&f, &Policy::default());
        assert_eq!(got.status(), Status::Fail);
        assert!(
            got.summary.contains("does not load: undefined symbol"),
            "{}",
            got.summary
        );
        let mut undated = torch_image();
        if let LibraryState::Loaded(l) = &mut undated.rdma.nccl.library.state {
            l.version = Observed::Error(FactError::new("ncclGetVersion", "ncclResult 3"));
        }
        assert_eq!(judge(&undated, &Policy::default()).status(), Status::Warn);
    }
}
