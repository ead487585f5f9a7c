//! GPU topology derived from facts, pure: how each pair of GPUs is linked in
//! `nvidia-smi topo -m` notation, the P2P matrix, and what CUDA_VISIBLE_DEVICES
//! selects. Shared by the checks, `doctor` and tuning.

pub mod acs;
pub mod affinity;
pub mod matrix;
pub mod visible;
