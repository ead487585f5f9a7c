//! PyTorch's flight recorder, on, with its dump pipe and dumps in a directory the trainer
//! and the sidecar share (`--flight-recorder DIR`), for `serve --watch-nccl`'s hang
//! report (serve/ras/flight.rs reads what these make).
//!
//! The names, from torch/csrc/distributed/c10d (FlightRecorder.hpp's constructor,
//! ProcessGroupNCCL's DumpPipe, DebugInfoWriter::getWriter) across releases: the buffer
//! is `TORCH_FR_BUFFER_SIZE` with `TORCH_NCCL_TRACE_BUFFER_SIZE` as its older name (read
//! when the new one is unset; the dump pipe of PyTorch up to 2.8 reads only the old one,
//! and a buffer of 0, the default before 2.10, turns the recorder off); the pipe is
//! `TORCH_NCCL_DEBUG_INFO_PIPE_FILE` (`<value><rank>.pipe`); the dump file is
//! `TORCH_FR_DUMP_TEMP_FILE`, older `TORCH_NCCL_DEBUG_INFO_TEMP_FILE` (`<value><rank>`).
//! Both names of each are set, so every release finds its own; a release that reads both
//! logs once that the old one is deprecated (getCvarInt's WARN_ENV_VAR_ONCE).

use super::Setting;
use std::path::Path;

/// The names the settings and serve's reader (serve/ras/flight.rs) agree on, in DIR.
pub const PIPE_PREFIX: &str = "pipe_";
pub const DUMP_PREFIX: &str = "dump_";

/// Entries kept: PyTorch's own default from 2.10 on (about 50 KB per 350 entries dumped).
const ENTRIES: &str = "2000";

pub fn settings(dir: &Path) -> Vec<Setting> {
    let dir = dir.display();
    let buffer = "PyTorch's flight recorder on: the last 2000 collectives of each rank with the Python stack that issued them, which serve --watch-nccl reads on a hang";
    let dump = format!(
        "where each rank writes its flight recorder dump ({DUMP_PREFIX}<rank>), which serve --watch-nccl --flight-recorder {dir} reads"
    );
    vec![
        Setting::tuned("TORCH_FR_BUFFER_SIZE", ENTRIES, buffer),
        Setting::tuned(
            "TORCH_NCCL_TRACE_BUFFER_SIZE",
            ENTRIES,
            format!("{buffer} (the name PyTorch up to 2.8 reads, its dump pipe included)"),
        ),
        Setting::tuned(
            "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
            format!("{dir}/{PIPE_PREFIX}"),
            format!(
                "each rank's dump pipe ({PIPE_PREFIX}<rank>.pipe): serve --watch-nccl writes a line to it on a hang and the rank dumps its flight recorder"
            ),
        ),
        Setting::tuned(
            "TORCH_FR_DUMP_TEMP_FILE",
            format!("{dir}/{DUMP_PREFIX}"),
            dump.clone(),
        ),
        Setting::tuned(
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
            format!("{dir}/{DUMP_PREFIX}"),
            format!("{dump} (the name before PyTorch 2.9)"),
        ),
    ]
}
