//! `cuda-runtime`: the CUDA runtime (libcudart) the training image holds against the
//! CUDA version the node's driver supports (cuDriverGetVersion).
//!
//! NVIDIA's rules (https://docs.nvidia.com/deploy/cuda-compatibility/):
//! - A runtime no newer than the driver's CUDA version always runs (backward
//!   compatibility).
//! - Minor-version compatibility (minor-version-compatibility.html): from CUDA 11 on, a
//!   runtime of the same major version as the driver's runs on an older minor driver
//!   (CUDA 12.x needs driver >= 525, 11.x >= 450), with a limited feature set: calls the
//!   driver lacks return cudaErrorCallRequiresNewerDriver (36), and PTX built by the newer
//!   toolkit cannot be JIT-compiled by the older driver (cudaErrorUnsupportedPtxVersion,
//!   222), which breaks kernels shipped as PTX only.
//! - Otherwise (a newer major, or any newer version before CUDA 11) the first CUDA call
//!   fails: "CUDA driver version is insufficient for CUDA runtime version"
//!   (cudaErrorInsufficientDriver, 35).
//! - Forward compatibility (forward-compatibility.html): the cuda-compat package puts a
//!   newer libcuda in /usr/local/cuda/compat; on data-center GPUs (and select NGC-ready
//!   RTX SKUs) a process that loads it first gets that libcuda's CUDA version, which
//!   cuDriverGetVersion then reports. Elsewhere cuInit fails with
//!   CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE (804), which gpu-devices reports.
//!
//! The runtimes are the image's own files: in nccl-preflight's own image this skips.

use super::{Finding, Problem};
use crate::facts::gpu::{CUDA_COMPAT_DIR, LibraryState, cuda_version_text};
use crate::facts::{Facts, ImageRole};
use crate::finding::Outcome;
use crate::policy::Policy;
use crate::predict::Prediction;

pub const ID: &str = "cuda-runtime";

/// The CUDA version the driver supports, and where it was read: cuDriverGetVersion (the
/// libcuda this process loaded, a compat one included), else NVML's.
fn driver_cuda(facts: &Facts) -> Option<(i32, &'static str)> {
    let cuda = facts
        .gpus
        .cuda
        .loaded()
        .and_then(|c| c.driver_version.value().copied())
        .filter(|v| *v > 0)
        .map(|v| (v, "cuDriverGetVersion"));
    cuda.or_else(|| {
        facts
            .gpus
            .nvml
            .loaded()
            .and_then(|n| n.cuda_driver_version.value().copied())
            .filter(|v| *v > 0)
            .map(|v| (v, "NVML"))
    })
}

/// How a runtime of CUDA `runtime` fares on a driver of CUDA `driver`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// No newer than the driver.
    Supported,
    /// Same major (11 and later), newer minor: runs with minor-version compatibility.
    MinorCompatible,
    /// The first CUDA call fails.
    TooNew,
}

pub fn fit(runtime: i32, driver: i32) -> Fit {
    if runtime <= driver {
        Fit::Supported
    } else if runtime / 1000 == driver / 1000 && runtime >= 11000 {
        Fit::MinorCompatible
    } else {
        Fit::TooNew
    }
}

/// The problem a runtime of CUDA `v` makes on a driver of CUDA `driver` (`compat`: the
/// image has the forward-compatibility package).
fn fit_problem(v: i32, driver: i32, compat: bool) -> Option<Problem> {
    let (v_text, driver_text) = (cuda_version_text(v), cuda_version_text(driver));
    match fit(v, driver) {
        Fit::Supported => None,
        Fit::MinorCompatible => Some(Problem::predicts(
            Outcome::undetermined(
                "whether the job calls CUDA APIs or runs PTX newer than the driver: those fail, the rest runs",
            ),
            format!(
                "libcudart {v_text} runs on this CUDA {driver_text} driver only through minor-version compatibility: \
                 calls the driver lacks fail (cudaErrorCallRequiresNewerDriver) and PTX from the {v_text} toolkit cannot be JIT-compiled (cudaErrorUnsupportedPtxVersion)"
            ),
            format!(
                "Upgrade the node's driver to one that supports CUDA {v_text}, or use an image built for CUDA {driver_text} or older \
                 (e.g. the PyTorch wheel for that CUDA version)."
            ),
        )),
        Fit::TooNew => {
            let fix = if !compat {
                format!(
                    "Upgrade the node's driver to one that supports CUDA {v_text}, or use an image built for CUDA {driver_text} or older \
                     (e.g. the PyTorch wheel for that CUDA version). On data-center GPUs the forward-compatibility package \
                     (cuda-compat-{}-{}) in the image also works: it installs {CUDA_COMPAT_DIR}; put that directory first on LD_LIBRARY_PATH.",
                    v / 1000,
                    (v % 1000) / 10
                )
            } else {
                format!(
                    "The image has the forward-compatibility package, but this process did not load its libcuda: \
                     put it first on the library path (LD_LIBRARY_PATH={CUDA_COMPAT_DIR}:$LD_LIBRARY_PATH); it works on data-center GPUs only. \
                     Otherwise upgrade the node's driver to one that supports CUDA {v_text}."
                )
            };
            Some(Problem::predicts(
                Outcome::cannot_start(
                    "the first CUDA call fails (cudaErrorInsufficientDriver): no GPU work, NCCL's included",
                ),
                format!(
                    "libcudart {v_text} needs a newer driver than this one (CUDA {driver_text}): \
                     the first CUDA call fails with \"CUDA driver version is insufficient for CUDA runtime version\""
                ),
                fix,
            ))
        }
    }
}

/// The image's runtimes and forward-compatibility files, as evidence.
fn runtime_evidence(rt: &crate::facts::gpu::CudaRuntimeFacts) -> Vec<String> {
    let mut evidence: Vec<String> = Vec::new();
    for r in &rt.libraries {
        evidence.push(match r.version.value() {
            Some(v) => format!(
                "libcudart {} ({}) at {}",
                cuda_version_text(*v),
                r.found_by,
                r.path
            ),
            None => format!(
                "libcudart at {} ({}): version unknown: {}",
                r.path,
                r.found_by,
                r.version.error().map(|e| e.to_string()).unwrap_or_default()
            ),
        });
    }
    for f in &rt.compat_libcuda {
        evidence.push(format!(
            "forward-compatibility package: {CUDA_COMPAT_DIR}/{f}"
        ));
    }
    evidence
}

/// Neither libcuda nor NVML gave the driver's CUDA version: nothing to date against (a
/// skip where there is no NVML at all).
fn driver_unknown(facts: &Facts, evidence: Vec<String>) -> Finding {
    let summary =
        "the driver's CUDA version is unknown: the image's CUDA runtime cannot be dated against it";
    let mut f = match facts.gpus.nvml.state {
        LibraryState::NotFound { .. } => Finding::skip(ID, summary),
        _ => Finding::predicts(
            ID,
            Outcome::undetermined("whether the driver runs the image's CUDA runtime"),
            summary,
            "See gpu-devices for why neither libcuda nor NVML answered.",
        ),
    };
    f.evidence = evidence;
    f
}

pub fn judge(facts: &Facts, _prediction: &Prediction, _policy: &Policy) -> Finding {
    let rt = &facts.gpus.cuda_runtime;
    if facts.image == ImageRole::Own {
        return Finding::skip(
            ID,
            format!("the CUDA runtime not dated: {}", ImageRole::OWN_REASON),
        );
    }
    if let Some(reason) = &rt.skipped {
        return Finding::skip(ID, format!("the CUDA runtime not dated: {reason}"));
    }
    if rt.libraries.is_empty() {
        return Finding::skip(
            ID,
            "no CUDA runtime (libcudart) in this image: nothing to date against the driver",
        )
        .evidence(rt.attempts.join("; "));
    }
    let mut evidence = runtime_evidence(rt);
    let kernel_cuda = facts
        .gpus
        .nvml
        .loaded()
        .and_then(|n| n.cuda_driver_version.value().copied());
    let Some((driver, source)) = driver_cuda(facts) else {
        return driver_unknown(facts, evidence);
    };
    evidence.insert(
        0,
        format!(
            "driver supports CUDA {} ({source})",
            cuda_version_text(driver)
        ),
    );
    if let Some(k) = kernel_cuda
        && source == "cuDriverGetVersion"
        && k > 0
        && k < driver
    {
        evidence.insert(
            1,
            format!(
                "the kernel driver itself supports CUDA {}: libcuda comes from a forward-compatibility package",
                cuda_version_text(k)
            ),
        );
    }
    let driver_text = cuda_version_text(driver);
    let mut problems = Vec::new();
    let mut newest = None::<i32>;
    for r in &rt.libraries {
        let Some(&v) = r.version.value() else {
            continue;
        };
        newest = Some(newest.map_or(v, |n| n.max(v)));
        problems.extend(fit_problem(v, driver, !rt.compat_libcuda.is_empty()));
    }
    let summary = match newest {
        Some(v) => format!(
            "CUDA runtime {} under a driver that supports CUDA {driver_text}",
            cuda_version_text(v)
        ),
        None => {
            problems.push(Problem::predicts(
                Outcome::undetermined("whether the driver runs the image's CUDA runtime"),
                "no libcudart in this image could be dated: its version could not be read",
                "Run `nccl-preflight facts` in the training image and see gpus.cuda_runtime.",
            ));
            String::new()
        }
    };
    super::combine(ID, summary, evidence, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Observed;
    use crate::facts::gpu::{CudaRuntime, LibraryState};
    use crate::finding::Status;
    use crate::test_facts::healthy;

    /// The judge as the run calls it, with the prediction made from the same facts.
    fn judge(facts: &Facts, policy: &Policy) -> Finding {
        crate::test_facts::judged(super::judge, facts, policy)
    }

    fn with_runtime(mut facts: Facts, version: i32, driver: i32) -> Facts {
        facts.gpus.cuda_runtime.libraries = vec![CudaRuntime {
            found_by: "LD_LIBRARY_PATH / ld.so.cache".into(),
            path: "/usr/local/cuda/lib64/libcudart.so.12".into(),
            version: Observed::Value(version),
        }];
        if let LibraryState::Loaded(c) = &mut facts.gpus.cuda.state {
            c.driver_version = Observed::Value(driver);
        }
        facts
    }

    #[test]
    fn compatibility_rules() {
        assert_eq!(fit(12080, 13000), Fit::Supported);
        assert_eq!(fit(12080, 12080), Fit::Supported);
        assert_eq!(fit(12080, 12040), Fit::MinorCompatible);
        assert_eq!(fit(13000, 12090), Fit::TooNew);
        // Before CUDA 11 there was no minor-version compatibility.
        assert_eq!(fit(10020, 10010), Fit::TooNew);
    }

    #[test]
    fn a_runtime_the_driver_supports_passes() {
        let f = judge(&healthy(), &Policy::default());
        assert_eq!(f.status(), Status::Pass, "{f:?}");
        assert!(f.summary.contains("CUDA runtime 12.8"), "{}", f.summary);
        assert!(f.evidence[0].contains("CUDA 13.0 (cuDriverGetVersion)"));
    }

    #[test]
    fn a_newer_minor_warns_and_a_newer_major_fails_with_the_fix() {
        let f = judge(&with_runtime(healthy(), 12080, 12040), &Policy::default());
        assert_eq!(f.status(), Status::Warn);
        assert!(f.summary.contains("minor-version compatibility"));
        let f = judge(&with_runtime(healthy(), 13000, 12040), &Policy::default());
        assert_eq!(f.status(), Status::Fail);
        assert!(f.summary.contains("insufficient"), "{}", f.summary);
        let fix = f.remediation().unwrap();
        assert!(fix.contains("cuda-compat-13-0"), "{fix}");
        // With the compat package installed but not loaded, the fix is the library path.
        let mut compat = with_runtime(healthy(), 13000, 12040);
        compat.gpus.cuda_runtime.compat_libcuda = vec!["libcuda.so.580.65.06".into()];
        let judged = judge(&compat, &Policy::default());
        let fix = judged.remediation().unwrap();
        assert!(
            fix.contains("LD_LIBRARY_PATH=/usr/local/cuda/compat"),
            "{fix}"
        );
    }

    #[test]
    fn a_compat_libcuda_in_use_is_said_and_passes() {
        // cuDriverGetVersion answers the compat libcuda's 13.0 while NVML says the kernel driver is 12.4.
        let mut f = with_runtime(healthy(), 13000, 13000);
        if let LibraryState::Loaded(n) = &mut f.gpus.nvml.state {
            n.cuda_driver_version = Observed::Value(12040);
        }
        let finding = judge(&f, &Policy::default());
        assert_eq!(finding.status(), Status::Pass);
        assert!(finding.evidence[1].contains("forward-compatibility"));
    }

    #[test]
    fn own_image_no_runtime_and_no_driver_skip() {
        let mut own = healthy();
        own.image = ImageRole::Own;
        assert_eq!(judge(&own, &Policy::default()).status(), Status::Skip);
        let mut none = healthy();
        none.gpus.cuda_runtime.libraries.clear();
        assert_eq!(judge(&none, &Policy::default()).status(), Status::Skip);
        let mut no_driver = healthy();
        no_driver.gpus = crate::test_facts::no_gpus();
        no_driver.gpus.cuda_runtime = healthy().gpus.cuda_runtime;
        assert_eq!(judge(&no_driver, &Policy::default()).status(), Status::Skip);
        let mut unknown = healthy();
        unknown.gpus.cuda_runtime.libraries[0].version = Observed::Error(
            crate::facts::FactError::new("dlopen(libcudart.so.12)", "wrong ELF class"),
        );
        let f = judge(&unknown, &Policy::default());
        assert_eq!(f.status(), Status::Warn);
        assert!(f.remediation().is_some());
    }
}
