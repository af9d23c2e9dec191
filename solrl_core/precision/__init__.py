"""Precision: the explore copy's low-precision GEMMs (`nvfp4` emulation, `fp8` through torch._scaled_mm),
which layers they replace (`quantize`), what this machine's GPUs and Transformer Engine support
(`hardware`), and what the config's `auto` switches resolve to here (`resolve`)."""
