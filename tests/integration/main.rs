//! Integration tests: the built binary, end to end. One test binary, a module per topic.

mod attacks;
mod bench;
mod binary;
mod bounded;
mod cli;
mod deploy;
mod exec;
mod explain;
mod fixtures;
mod function_length;
mod gang;
mod gang_fake;
mod gang_netns;
mod gang_script;
mod image;
mod kernel;
mod layering;
mod nccl_vars;
mod netns;
mod outputs;
mod prediction;
mod rdma;
mod scenarios;
mod schema;
mod serve;
mod support;
