//! libfabric's facts, loaded from the EFA installer's directory first (its build
//! carries the efa provider; aws-ofi-nccl is linked against it), then the
//! default search path: version, providers, and fi_getinfo for efa with RDM
//! endpoints, as aws-ofi-nccl asks (the calls are vendor::fabric's). A libfabric
//! that exists but whose own dependencies are missing is a common trap: every
//! attempt keeps dlerror's text.

use crate::facts::rdma::{FabricFacts, LoadAttempt};
use crate::vendor::deadline::Watch;
use crate::vendor::dl::LoadError;
use crate::vendor::fabric::OpenError;

/// Where libfabric is looked for, in order (FACTS.md section 4: EFA's lives outside the default path).
pub const LOCATIONS: &[&str] = &[
    "/opt/amazon/efa/lib/libfabric.so.1",
    "/opt/amazon/efa/lib64/libfabric.so.1",
    "libfabric.so.1",
];

/// How loading libfabric ended.
pub type Outcome = crate::gather::Outcome<FabricFacts>;

pub fn gather(watch: &Watch, locations: &[String]) -> (Outcome, Vec<LoadAttempt>) {
    let mut attempts = Vec::new();
    let mut broken = None;
    for location in locations {
        let fabric = match crate::vendor::fabric::open(watch, location) {
            Ok(fabric) => fabric,
            Err(OpenError::Load(e)) => {
                let message = match e {
                    LoadError::Missing(message) => message,
                    LoadError::Failed(e) => {
                        let message = e.message.clone();
                        broken.get_or_insert(e);
                        message
                    }
                };
                attempts.push(LoadAttempt {
                    library: location.clone(),
                    error: Some(message),
                });
                continue;
            }
            Err(OpenError::Api(e)) => {
                attempts.push(LoadAttempt {
                    library: location.clone(),
                    error: None,
                });
                return (Outcome::Failed(e), attempts);
            }
        };
        attempts.push(LoadAttempt {
            library: location.clone(),
            error: None,
        });
        let version = fabric.version();
        let mut names = fabric.providers(version);
        names.sort();
        names.dedup();
        let facts = FabricFacts {
            version: format!("{}.{}", version >> 16, version & 0xffff),
            providers: names,
            efa_rdm: fabric.efa_rdm(version).into(),
        };
        return (Outcome::Loaded(facts), attempts);
    }
    let outcome = match broken {
        Some(e) => Outcome::Failed(e),
        None => Outcome::NotFound(
            attempts
                .iter()
                .filter_map(|a| a.error.clone())
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    (outcome, attempts)
}
