//! vendor: the libraries NCCL jobs depend on, each loaded at run time and called
//! through one typed module: NVML (`nvml`), the CUDA driver (`cuda`), the CUDA
//! runtime (`cudart`), libnccl and its net plugin (`nccl`), libibverbs (`verbs`)
//! and libfabric (`fabric`). Nothing else in the crate calls dlopen or declares a
//! vendor symbol (tests/integration/layering.rs holds it). Every call runs under
//! the one deadline mechanism (`deadline`), and a failure is a `FactError` with
//! the existing `FailureKind`s, so a fix to a deadline, an error kind or a version
//! quirk reaches gather, bench, gang and serve alike.

pub mod cuda;
pub mod cudart;
pub mod deadline;
pub mod dl;
pub mod fabric;
pub mod nccl;
pub mod nvml;
pub mod verbs;
